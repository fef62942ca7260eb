'use strict';
// The EnvService gRPC handlers (grpc-js): unary, batched and streamed access to a SessionTable, mirroring
// env_servers/server/service.py. Env code runs on the event loop; an async env (returning Promises) does not
// block other sessions. A batch runs its items in order, one after the other (as the Python server does), and
// honours the deadline item by item: an item whose deadline has passed before it starts is answered
// DEADLINE_EXCEEDED without touching the env, so a retry runs it exactly once. Work whose caller gave up
// (deadline, cancel) still completes and is replayable by request_id.

const crypto = require('crypto');
const { status } = require('@grpc/grpc-js');
const { ProtocolError, describeError } = require('./sessions');

const PROTOCOL_VERSION = 'v1';
const IMPLEMENTATION = 'env_servers-node/0.1.0';
const SERVICE_NAME = 'roll_lightning.env.v1.EnvService';
const MALFORMED = Symbol('malformed');
// The optional parts served (see the proto header). No "batch-mixed": BatchStep does not run its `resets`.
// "fork" serves ForkSession; EnvSpec.forkable says which envs can be forked (lib/fork.js).
const CAPABILITIES = Object.freeze(['batch', 'stream', 'images', 'tools', 'fork']);
const DRAINING_MESSAGE = 'draining: server is shutting down; use another server';

function deadlineOf(call) {
  const deadline = call.getDeadline();
  if (deadline instanceof Date) return deadline.getTime();
  return typeof deadline === 'number' ? deadline : Infinity;
}

function toRpcError(err, log) {
  if (err instanceof ProtocolError) return { code: err.code, details: err.message };
  log(`internal error: ${err && err.stack ? err.stack : err}`);
  return { code: status.INTERNAL, details: `server error: ${describeError(err)}` };
}

class EnvService {
  constructor(table, { maxActionBytes, token = null, log = () => undefined }) {
    this.table = table;
    this.maxActionBytes = maxActionBytes;
    this.expected = token ? Buffer.from(`Bearer ${token}`) : null;
    this.log = log;
    this.draining = false;
  }

  // -- helpers -----------------------------------------------------------------------------------------

  authorized(call) {
    if (this.expected === null) return true;
    const given = call.metadata.get('authorization')[0];
    const buf = Buffer.from(typeof given === 'string' ? given : given ? given.toString() : '');
    return buf.length === this.expected.length && crypto.timingSafeEqual(buf, this.expected);
  }

  /** While draining, new sessions and episodes are refused (retries of answered requests are replayed). */
  refuseNewWork() {
    if (this.draining) throw new ProtocolError(status.UNAVAILABLE, DRAINING_MESSAGE);
  }

  resetItem(req) {
    // The drain check runs in the session's turn, after the replay check: a retried Reset is still answered.
    return this.table.run(req.session_id, (s) => s.reset(req, () => this.refuseNewWork()));
  }

  stepItem(req) {
    return this.table.run(req.session_id, (s) => s.step(req, this.maxActionBytes));
  }

  /** One item of a batch or stream: never rejects; a failure becomes the item's Status. */
  async item(run, req, deadline) {
    try {
      if (Date.now() >= deadline) {
        throw new ProtocolError(status.DEADLINE_EXCEEDED, 'deadline expired before this item ran');
      }
      return await run(req);
    } catch (err) {
      const failure = err instanceof ProtocolError ? err : new ProtocolError(status.INTERNAL, describeError(err));
      if (!(err instanceof ProtocolError)) this.log(`internal error: ${err && err.stack ? err.stack : err}`);
      return { status: failure.status(), session_id: (req && req.session_id) || '' };
    }
  }

  async batch(items, run, deadline) {
    const results = [];
    for (const req of items || []) results.push(await this.item(run, req, deadline));
    return results;
  }

  /** A unary handler: checks auth/decoding/deadline, runs `fn(request, call)` (sync or async). */
  unary(fn) {
    return (call, callback) => {
      if (!this.authorized(call)) {
        callback({ code: status.UNAUTHENTICATED, details: 'missing or wrong bearer token' });
        return;
      }
      const request = call.request;
      if (request && request[MALFORMED]) {
        callback({ code: status.INVALID_ARGUMENT, details: request[MALFORMED] });
        return;
      }
      if (Date.now() >= deadlineOf(call)) {
        callback({ code: status.DEADLINE_EXCEEDED, details: 'deadline expired before the call started' });
        return;
      }
      let result;
      try {
        result = fn(request || {}, call);
      } catch (err) {
        callback(toRpcError(err, this.log));
        return;
      }
      Promise.resolve(result).then(
        (value) => callback(null, value),
        (err) => callback(toRpcError(err, this.log)),
      );
    };
  }

  // -- RPCs --------------------------------------------------------------------------------------------

  handlers() {
    return {
      GetServerInfo: this.unary(() => ({
        protocol_version: PROTOCOL_VERSION,
        server_id: this.table.serverId,
        env_ids: this.table.envIds,
        max_sessions: this.table.maxSessions,
        active_sessions: this.table.size,
        draining: this.draining,
        max_action_bytes: this.maxActionBytes,
        session_ttl_s: this.table.sessionTtlS,
        implementation: IMPLEMENTATION,
        capabilities: [...CAPABILITIES],
      })),
      DescribeEnv: this.unary((req) => this.table.describe(req.env_id, req.config)),
      CreateSession: this.unary((req) => this.table.create(req, () => this.refuseNewWork())),
      // Copies are new work: refused while draining, after the replay check (a retried fork is still answered).
      ForkSession: this.unary((req) => this.table.fork(req, () => this.refuseNewWork())),
      CloseSession: this.unary((req) => ({ existed: this.table.close(req.session_id) })),
      Reset: this.unary((req) => this.resetItem(req)),
      Step: this.unary((req) => this.stepItem(req)),
      BatchReset: this.unary(async (req, call) => ({
        items: await this.batch(req.items, (r) => this.resetItem(r), deadlineOf(call)),
      })),
      BatchStep: this.unary(async (req, call) => ({
        items: await this.batch(req.items, (r) => this.stepItem(r), deadlineOf(call)),
      })),
      Stream: (call) => this.stream(call),
    };
  }

  /** Multiplexed bidi stream: each request runs as it arrives; answers go out as they complete, by tag. */
  stream(call) {
    if (!this.authorized(call)) {
      call.emit('error', { code: status.UNAUTHENTICATED, details: 'missing or wrong bearer token' });
      return;
    }
    let pending = 0;
    let inputEnded = false;
    let closed = false;
    const finish = () => {
      if (inputEnded && pending === 0 && !closed) {
        closed = true;
        call.end();
      }
    };
    call.on('data', (req) => {
      if (closed) return;
      if (req && req[MALFORMED]) {
        closed = true;
        call.emit('error', { code: status.INVALID_ARGUMENT, details: req[MALFORMED] });
        return;
      }
      pending += 1;
      this.answer(req)
        .then((response) => {
          if (!closed && !call.cancelled) call.write(response);
        })
        .finally(() => {
          pending -= 1;
          finish();
        });
    });
    call.on('end', () => {
      inputEnded = true;
      finish();
    });
    call.on('cancelled', () => {
      closed = true;
    });
  }

  async answer(req) {
    const tag = req.tag;
    if (req.reset) return { tag, reset: await this.item((r) => this.resetItem(r), req.reset, Infinity) };
    if (req.step) return { tag, step: await this.item((r) => this.stepItem(r), req.step, Infinity) };
    // Neither set: answered with its tag (the stream stays open), as the proto header says.
    const message = 'request: a StreamRequest sets exactly one of reset or step (neither was set)';
    return { tag, step: { status: { code: status.INVALID_ARGUMENT, message } } };
  }
}

/** The service definition with decoding guarded: an undecodable request reaches the handler as MALFORMED. */
function guardedDefinition(definition) {
  const guarded = {};
  for (const [name, method] of Object.entries(definition)) {
    const decode = method.requestDeserialize;
    const typeName = `${name}Request`;
    guarded[name] = {
      ...method,
      requestDeserialize: (buffer) => {
        try {
          return decode(buffer);
        } catch (err) {
          return { [MALFORMED]: `request is not a valid ${typeName} message: ${err.message}` };
        }
      },
    };
  }
  return guarded;
}

module.exports = {
  EnvService,
  guardedDefinition,
  PROTOCOL_VERSION,
  IMPLEMENTATION,
  SERVICE_NAME,
  CAPABILITIES,
  DRAINING_MESSAGE,
};
