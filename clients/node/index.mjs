// pg-idem as an ES module: the CommonJS package's exports, by name.
import idem from './index.js';

export const {
  fastify, express, withIdempotency, enqueue, createDispatcher, registerIdempotentTool, idempotentRequest,
  IdemError, canonicalJson, fingerprint, MAX_KEY_LENGTH,
} = idem;
export default idem;
