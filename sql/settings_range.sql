--
-- settings_range.sql: values outside a setting's range are refused.  The
-- message's range has units from PostgreSQL 17 on: settings_range_1.out.
--
LOAD 'idem';
SET idem.retention = 0;
SET idem.max_body_size = '2GB';
SET idem.lease = '-1s';
