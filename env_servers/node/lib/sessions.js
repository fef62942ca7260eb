'use strict';
// Sessions and the episode state machine: ids, step ordering, idempotent replay, capacity, idle reaping.
// The protocol's rules live here (service.js owns the transport), mirroring env_servers/server/sessions.py:
// - Reset/Step/CreateSession carry a client request_id; the same request_id on the latest call of its kind
//   replays the cached answer instead of running the env again.
// - Step must name the current episode_id and the next step_index; anything else is FAILED_PRECONDITION.
// - An exception inside the env aborts that episode (INTERNAL); the session survives and can Reset.
// - An observation that breaks an image rule (lib/images.js) is never sent: INTERNAL naming the rule.
// - Tool calls (lib/tools.js): bad calls are answered by the runtime with error results (a normal step,
//   action_valid=false, the env's bad-call penalty); the env sees the good calls only and must answer each one,
//   with its id, in order (else INTERNAL naming the rule).
// - ForkSession copies an episode in progress into new sessions (lib/fork.js copies the env): each copy has its
//   own ids, env and seed RNG, continues at the original's next step_index, and is a session like any other.
// Calls to one session are serialised by a per-session promise chain (envs may be async), so two retries
// racing each other still see a consistent state; a busy session is never reaped.

const crypto = require('crypto');
const { status } = require('@grpc/grpc-js');
const { ConfigError, parseConfig, configSchema } = require('./config');
const { canFork, deepCopy, forkEnv } = require('./fork');
const { ImageRuleBroken, observationParts } = require('./images');
const { SplitMix64 } = require('./prng');
const { ToolRuleBroken, badCallPenalty, checkCalls, mergeResults, toolBox, toolsToWire } = require('./tools');
const { fromStruct, toStruct, stableStringify } = require('./values');

const UINT64_MAX = (1n << 64n) - 1n;
const MAX_FORK_COPIES = 64; // the most copies one ForkSession makes (env.proto)

class ProtocolError extends Error {
  constructor(code, message) {
    super(message);
    this.code = code;
  }

  status() {
    return { code: this.code, message: this.message };
  }
}

const newId = (prefix) => `${prefix}-${crypto.randomBytes(6).toString('hex')}`;
const isThenable = (value) => value !== null && typeof value === 'object' && typeof value.then === 'function';

/** Python-repr-like text of an exception, e.g. Error('boom'). */
function describeError(err) {
  if (err instanceof Error) return `${err.name}(${JSON.stringify(err.message).replace(/^"|"$/g, "'")})`;
  return String(err);
}

/** The INTERNAL message for an env's failure in `call` ("reset", "step 3"): the image rule broken, or the error. */
function envFault(envId, call, err) {
  if (err instanceof ImageRuleBroken) {
    return `env '${envId}' ${call}: its observation breaks an image rule (never sent): ${err.message}`;
  }
  if (err instanceof ToolRuleBroken) {
    return `env '${envId}' ${call}: its tool results break the tool rule (never sent): ${err.message}`;
  }
  return `env '${envId}' ${call} raised ${describeError(err)}`;
}

/** A uint64 from the wire (String with longs: String; Number or Long otherwise) -> BigInt. */
function toBigInt(value) {
  if (typeof value === 'bigint') return value;
  if (value !== null && typeof value === 'object' && 'low' in value && 'high' in value) {
    return (BigInt(value.high >>> 0) << 32n) | BigInt(value.low >>> 0);
  }
  return BigInt(value);
}

const now = () => performance.now() / 1000;

class Session {
  constructor(sessionId, entry, config, env, spec, rng, box = null) {
    this.sessionId = sessionId;
    this.entry = entry;
    this.config = config;
    this.env = env;
    this.spec = spec;
    this.box = box; // the env's tools (lib/tools.js toolBox), null for a text env
    this.rng = rng;
    this.lastUsed = now();
    this.busy = 0;
    this.tail = Promise.resolve();
    this.episodeId = null;
    this.stepsTaken = 0;
    this.done = ''; // "", "terminated", "truncated" or "aborted"
    this.lastReset = null; // [request_id, ResetResult]
    this.lastStep = null; // [request_id, step_index, StepResult]
    this.lastFork = null; // [request_id, ForkSessionResponse]
  }

  /** An episode was reset and has neither ended nor been aborted. */
  get episodeOpen() {
    return this.episodeId !== null && !this.done;
  }

  /** An episode is in progress or a call to this session is running. */
  get inProgress() {
    return this.busy > 0 || this.episodeOpen;
  }

  /** A new session `sessionId` continuing this one's episode with `env` (a fork of this env): own ids and RNG. */
  copyAs(sessionId, env) {
    const copy = new Session(sessionId, this.entry, this.config, env, this.spec, deepCopy(this.rng), this.box);
    copy.episodeId = newId('ep');
    copy.stepsTaken = this.stepsTaken;
    return copy;
  }

  /**
   * Reset; a retry of the latest Reset is replayed. `refuseNew` (optional) runs before a *new* Reset starts
   * and throws to refuse it (the drain), so a retry is still answered while new episodes are refused.
   */
  async reset(req, refuseNew = null) {
    if (!req.request_id) throw new ProtocolError(status.INVALID_ARGUMENT, 'request_id is required');
    if (this.lastReset && this.lastReset[0] === req.request_id) {
      if (this.stepsTaken === 0 && this.lastReset[1].episode_id === this.episodeId) return this.lastReset[1];
      throw new ProtocolError(
        status.FAILED_PRECONDITION,
        `request_id '${req.request_id}' is a stale Reset: episode ${this.episodeId} has moved on`,
      );
    }
    if (refuseNew) refuseNew();
    let seed;
    if (req.seed !== undefined && req.seed !== null) {
      seed = toBigInt(req.seed);
      if (seed < 0n || seed > UINT64_MAX) throw new ProtocolError(status.INVALID_ARGUMENT, 'seed: not a uint64');
    } else {
      seed = this.rng.next() >> 1n; // [0, 2^63), like the Python server
    }
    const options = fromStruct(req.options);
    this.episodeId = null;
    this.stepsTaken = 0;
    this.done = '';
    this.lastStep = null;
    let result;
    try {
      let out = this.env.reset(seed, options);
      if (isThenable(out)) out = await out;
      const [obs, info] = out;
      const [text, images] = observationParts(obs);
      result = { session_id: this.sessionId, seed: seed.toString(), observation: text };
      if (images) result.images = images;
      if (info && Object.keys(info).length) result.info = toStruct(info);
    } catch (err) {
      throw new ProtocolError(status.INTERNAL, envFault(this.spec.env_id, 'reset', err));
    }
    this.episodeId = result.episode_id = newId('ep');
    this.lastReset = [req.request_id, result];
    return result;
  }

  async step(req, maxActionBytes) {
    if (!req.request_id) throw new ProtocolError(status.INVALID_ARGUMENT, 'request_id is required');
    if (!req.episode_id) throw new ProtocolError(status.INVALID_ARGUMENT, 'episode_id is required');
    const text = (req.action && req.action.text) || '';
    // A UTF-16 code unit is at most 3 UTF-8 bytes: short texts need no counting to be known to fit.
    const size = 3 * text.length <= maxActionBytes ? text.length : Buffer.byteLength(text, 'utf8');
    if (size > maxActionBytes) {
      throw new ProtocolError(
        status.INVALID_ARGUMENT,
        `action.text is ${Buffer.byteLength(text, 'utf8')} bytes; this server accepts ${maxActionBytes}`,
      );
    }
    const stepIndex = req.step_index || 0;
    const last = this.lastStep;
    if (last && last[0] === req.request_id && req.episode_id === this.episodeId && last[1] === stepIndex) {
      return last[2];
    }
    if (this.episodeId === null) {
      throw new ProtocolError(status.FAILED_PRECONDITION, 'no episode in progress: call Reset first');
    }
    if (req.episode_id !== this.episodeId) {
      throw new ProtocolError(
        status.FAILED_PRECONDITION,
        `episode_id '${req.episode_id}' is not the current episode '${this.episodeId}'`,
      );
    }
    if (this.done) {
      throw new ProtocolError(
        status.FAILED_PRECONDITION,
        `episode ${this.episodeId} is over (${this.done} after ${this.stepsTaken} steps): call Reset`,
      );
    }
    if (stepIndex !== this.stepsTaken) {
      throw new ProtocolError(
        status.FAILED_PRECONDITION,
        `step_index=${stepIndex} but the next step of episode ${this.episodeId} is ${this.stepsTaken}`,
      );
    }
    const calls = (req.action && req.action.tool_calls) || [];
    // A tool env sees the good calls only (possibly none); a text env sees the text, and every call is bad.
    const checked = calls.length || this.box !== null ? checkCalls(calls, this.box) : null;
    const badCall = checked !== null && checked.errors.some((error) => error !== null);
    const start = performance.now();
    let result;
    try {
      let out = this.box === null ? this.env.step(text) : this.env.step(text, checked.good);
      if (isThenable(out)) out = await out;
      const [obs, rawReward, terminated, truncated, rawInfo] = out;
      let reward = Number(rawReward);
      if (!Number.isFinite(reward)) throw new RangeError(`non-finite reward ${rawReward}`);
      const info = { ...(rawInfo || {}) };
      const metrics = info.metrics || {};
      delete info.metrics;
      let actionValid = 'action_valid' in info ? Boolean(info.action_valid) : true;
      delete info.action_valid;
      let toolResults = null;
      if (checked !== null) {
        const given = obs !== null && typeof obs === 'object' ? obs.tool_results : undefined;
        toolResults = mergeResults(given, checked.good, checked.errors);
      }
      if (badCall) {
        // A reply cannot buy its way out of a bad call: the env's penalty, whatever the good calls earned.
        actionValid = false;
        reward = badCallPenalty(this.env, this.spec);
      }
      const [observation, images] = observationParts(obs);
      result = {
        session_id: this.sessionId,
        episode_id: this.episodeId,
        step_index: stepIndex,
        observation,
        reward,
        terminated: Boolean(terminated),
        truncated: Boolean(truncated),
        action_valid: actionValid,
        env_seconds: (performance.now() - start) / 1000,
      };
      if (images) result.images = images;
      if (toolResults && toolResults.length) result.tool_results = toolResults;
      const metricEntries = Object.entries(metrics);
      if (metricEntries.length) result.metrics = Object.fromEntries(metricEntries.map(([k, v]) => [k, Number(v)]));
      if (Object.keys(info).length) result.info = toStruct(info);
    } catch (err) {
      this.done = 'aborted';
      throw new ProtocolError(status.INTERNAL, envFault(this.spec.env_id, `step ${stepIndex}`, err));
    }
    this.stepsTaken += 1;
    this.done = result.terminated ? 'terminated' : result.truncated ? 'truncated' : '';
    this.lastStep = [req.request_id, stepIndex, result];
    return result;
  }
}

/** All sessions of one server process, with capacity, idempotent creation and idle reaping. */
class SessionTable {
  constructor(entries, { maxSessions, sessionTtlS, seed = null }) {
    this.entries = entries; // Map env_id -> registry entry
    this.envIds = [...entries.keys()];
    this.maxSessions = maxSessions;
    this.sessionTtlS = sessionTtlS;
    this.serverId = crypto.randomBytes(4).toString('hex');
    this.sessions = new Map();
    this.created = new Map(); // CreateSession request_id -> session_id, for replay (insertion ordered)
    this.specs = new Map(); // env_id + config JSON -> EnvSpec message, built once
    // Seeds the per-session RNGs that draw seeds for unseeded Resets.
    this.seeds = new SplitMix64(seed === null ? BigInt('0x' + crypto.randomBytes(8).toString('hex')) : seed);
  }

  get size() {
    return this.sessions.size;
  }

  entry(envId) {
    if (!envId) throw new ProtocolError(status.INVALID_ARGUMENT, 'env_id is required');
    const entry = this.entries.get(envId);
    if (!entry) {
      throw new ProtocolError(
        status.NOT_FOUND,
        `env_id '${envId}' is not served here (served: ${this.envIds.join(', ')})`,
      );
    }
    return entry;
  }

  static makeConfig(entry, configStruct) {
    try {
      const config = parseConfig(entry.fields, fromStruct(configStruct), entry.envId);
      if (entry.validate) entry.validate(config);
      return config;
    } catch (err) {
      if (err instanceof ConfigError) throw new ProtocolError(status.INVALID_ARGUMENT, err.message);
      throw err;
    }
  }

  describe(envId, configStruct) {
    const entry = this.entry(envId);
    return this.spec(entry, SessionTable.makeConfig(entry, configStruct));
  }

  spec(entry, config) {
    const key = `${entry.envId}\u0000${stableStringify(config)}`;
    let spec = this.specs.get(key);
    if (spec === undefined) {
      if (this.specs.size >= 1024) this.specs.clear(); // many distinct configs: start over
      const s = entry.describe(config);
      spec = {
        env_id: s.env_id,
        version: s.version,
        instruction: s.instruction,
        action_format: s.action_format,
        example_action: s.example_action,
        max_steps: s.max_steps,
        reward_min: s.reward_min,
        reward_max: s.reward_max,
        deterministic: s.deterministic !== false,
        splits: Object.fromEntries(Object.entries(s.splits || {}).map(([k, v]) => [k, String(v)])),
        config_schema: configSchema(entry.fields),
        config: toStruct(config),
        metrics: [...(s.metrics || [])],
        tools: toolsToWire(toolBox(s)),
        forkable: canFork(entry.envClass),
      };
      this.specs.set(key, spec);
    }
    return spec;
  }

  /** CreateSession; a retried request_id is replayed. `refuseNew` (optional) runs before a new session. */
  create(req, refuseNew = null) {
    if (!req.request_id) throw new ProtocolError(status.INVALID_ARGUMENT, 'request_id is required');
    const replay = this.created.get(req.request_id);
    if (replay !== undefined) {
      const session = this.get(replay);
      return { session_id: replay, spec: this.spec(session.entry, session.config) };
    }
    if (refuseNew) refuseNew();
    const entry = this.entry(req.env_id);
    const config = SessionTable.makeConfig(entry, req.config);
    if (this.sessions.size >= this.maxSessions) {
      throw new ProtocolError(
        status.RESOURCE_EXHAUSTED,
        `server ${this.serverId} is full (${this.maxSessions} sessions); close sessions or add servers`,
      );
    }
    const sessionId = newId(`s${this.serverId}`);
    const rng = new SplitMix64(this.seeds.next());
    let env;
    let spec;
    let box;
    try {
      env = entry.make(config);
      spec = entry.describe(config);
      box = toolBox(spec);
    } catch (err) {
      throw new ProtocolError(status.INTERNAL, `env '${req.env_id}' failed to start: ${describeError(err)}`);
    }
    const session = new Session(sessionId, entry, config, env, spec, rng, box);
    const response = { session_id: sessionId, spec: this.spec(entry, config) };
    this.sessions.set(sessionId, session);
    this.created.set(req.request_id, sessionId);
    while (this.created.size > 4 * this.maxSessions) this.created.delete(this.created.keys().next().value);
    return response;
  }

  /** ForkSession: `req.copies` new sessions continuing the session's episode; a retried request_id is replayed. */
  fork(req, refuseNew = null) {
    if (!req.request_id) throw new ProtocolError(status.INVALID_ARGUMENT, 'request_id is required');
    const copies = req.copies || 0;
    if (!(copies >= 1 && copies <= MAX_FORK_COPIES)) {
      throw new ProtocolError(status.INVALID_ARGUMENT, `copies=${copies}: fork 1 to ${MAX_FORK_COPIES}`);
    }
    return this.run(req.session_id, (session) => this.forkIn(session, req.request_id, copies, refuseNew));
  }

  /** The fork itself, in the original's turn: replay, then the refusals, then the copies, all or none. */
  async forkIn(original, requestId, count, refuseNew) {
    if (original.lastFork && original.lastFork[0] === requestId) return original.lastFork[1];
    if (refuseNew) refuseNew();
    const envId = original.spec.env_id;
    if (!canFork(original.entry.envClass)) {
      const why = `env '${envId}' cannot be forked (EnvSpec.forkable is false)`;
      throw new ProtocolError(status.FAILED_PRECONDITION, why);
    }
    if (!original.episodeOpen) {
      const state = original.episodeId !== null ? `its episode ${original.done}` : 'it was never reset';
      const why = `session ${original.sessionId} has no episode to fork: ${state}`;
      throw new ProtocolError(status.FAILED_PRECONDITION, why);
    }
    this.roomFor(count);
    const copies = [];
    try {
      for (let k = 0; k < count; k += 1) {
        let env = forkEnv(original.env);
        if (isThenable(env)) env = await env;
        copies.push(original.copyAs(newId(`s${this.serverId}`), env));
      }
      this.roomFor(count); // an async fork() lets other calls run: sessions made meanwhile may have taken the room
    } catch (err) {
      for (const made of copies) closeEnv(made);
      if (err instanceof ProtocolError) throw err;
      throw new ProtocolError(status.INTERNAL, envFault(envId, 'fork', err));
    }
    for (const made of copies) this.sessions.set(made.sessionId, made);
    const forks = copies.map((made) => ({ session_id: made.sessionId, episode_id: made.episodeId }));
    const result = { forks, step_index: original.stepsTaken };
    original.lastFork = [requestId, result];
    return result;
  }

  /** RESOURCE_EXHAUSTED unless `count` more sessions fit under max_sessions. */
  roomFor(count) {
    if (this.sessions.size + count > this.maxSessions) {
      throw new ProtocolError(
        status.RESOURCE_EXHAUSTED,
        `server ${this.serverId} has room for ${Math.max(0, this.maxSessions - this.sessions.size)} more sessions, ` +
          `not ${count} copies (${this.maxSessions} at most); close sessions or add servers`,
      );
    }
  }

  get(sessionId) {
    if (!sessionId) throw new ProtocolError(status.INVALID_ARGUMENT, 'session_id is required');
    const session = this.sessions.get(sessionId);
    if (session === undefined) {
      throw new ProtocolError(status.NOT_FOUND, `session '${sessionId}' is unknown or expired`);
    }
    return session;
  }

  close(sessionId) {
    if (!sessionId) throw new ProtocolError(status.INVALID_ARGUMENT, 'session_id is required');
    const session = this.sessions.get(sessionId);
    this.sessions.delete(sessionId);
    closeEnv(session);
    return session !== undefined;
  }

  /** Run `fn(session)` (sync or async) after the session's earlier calls; it is not reaped meanwhile. */
  run(sessionId, fn) {
    const session = this.get(sessionId);
    session.busy += 1;
    const result = session.tail.then(() => fn(session));
    session.tail = result.then(
      () => undefined,
      () => undefined,
    );
    return result.finally(() => {
      session.lastUsed = now();
      session.busy -= 1;
    });
  }

  /** How many sessions have an episode in progress (or a call running): the drain waits for them. */
  inProgress() {
    let count = 0;
    for (const session of this.sessions.values()) if (session.inProgress) count += 1;
    return count;
  }

  /** Close sessions unused for longer than the TTL; returns how many were closed. */
  reapIdle(at = now()) {
    let closed = 0;
    for (const [sessionId, session] of this.sessions) {
      if (!session.busy && at - session.lastUsed > this.sessionTtlS) {
        this.sessions.delete(sessionId);
        closeEnv(session);
        closed += 1;
      }
    }
    return closed;
  }
}

function closeEnv(session) {
  if (session && session.env && typeof session.env.close === 'function') {
    try {
      const out = session.env.close();
      if (isThenable(out)) out.then(null, () => undefined);
    } catch (_err) {
      // a failing close must not take the server down
    }
  }
}

module.exports = { ProtocolError, Session, SessionTable, describeError, MAX_FORK_COPIES };
