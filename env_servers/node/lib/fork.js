'use strict';
// Forking an env (ForkSession, the Fork rule of env.proto), as env_servers/api.py's can_fork/fork_env: an env
// class is forkable when it defines `fork()` (returns a copy, or a Promise of one) or sets the static
// `forkable = true`, which makes the runtime deep-copy the instance. The deep copy keeps every object's
// prototype, so a SplitMix64 (lib/prng.js) or any other PRNG object whose state is in its own properties is
// copied with that state: the copy draws the numbers the original would, independently of it. Functions are
// shared (they are code); what cannot be copied (private #fields, WeakMaps, Promises, sockets) needs `fork()`.

/** Whether sessions of `envClass` can be forked: it defines fork() or declares `static forkable = true`. */
function canFork(envClass) {
  if (typeof envClass !== 'function') return false;
  return typeof (envClass.prototype && envClass.prototype.fork) === 'function' || envClass.forkable === true;
}

/** A copy of `env` that steps exactly as `env` would and shares nothing a step changes: fork(), else a deep copy. */
function forkEnv(env) {
  return typeof env.fork === 'function' ? env.fork() : deepCopy(env);
}

/** A deep copy of `value`: same prototypes, cycles and shared references kept, functions shared. */
function deepCopy(value, seen = new Map()) {
  if (value === null || typeof value !== 'object') return value; // primitives (BigInt too), and functions: shared
  if (seen.has(value)) return seen.get(value);
  const copy = emptyLike(value);
  seen.set(value, copy);
  if (value instanceof Map) for (const [k, v] of value) copy.set(deepCopy(k, seen), deepCopy(v, seen));
  if (value instanceof Set) for (const v of value) copy.add(deepCopy(v, seen));
  if (!ArrayBuffer.isView(value)) copyOwnProperties(value, copy, seen);
  if (Object.isFrozen(value)) Object.freeze(copy);
  else if (Object.isSealed(value)) Object.seal(copy);
  else if (!Object.isExtensible(value)) Object.preventExtensions(copy);
  return copy;
}

/** A new, empty object of `value`'s kind and prototype; throws for what cannot be copied. */
function emptyLike(value) {
  const proto = Object.getPrototypeOf(value);
  if (Array.isArray(value)) return Object.setPrototypeOf([], proto);
  if (Buffer.isBuffer(value)) return Buffer.from(value);
  if (value instanceof DataView) return new DataView(value.buffer.slice(0), value.byteOffset, value.byteLength);
  if (ArrayBuffer.isView(value)) return new value.constructor(value); // a typed array: its own copy of the bytes
  if (value instanceof ArrayBuffer) return value.slice(0);
  if (value instanceof Map) return Object.setPrototypeOf(new Map(), proto);
  if (value instanceof Set) return Object.setPrototypeOf(new Set(), proto);
  if (value instanceof Date) return Object.setPrototypeOf(new Date(value.getTime()), proto);
  if (value instanceof RegExp) return Object.setPrototypeOf(new RegExp(value), proto);
  if (value instanceof WeakMap || value instanceof WeakSet || value instanceof WeakRef || isThenable(value)) {
    const kind = Object.prototype.toString.call(value).slice(8, -1);
    throw new TypeError(`cannot deep-copy a ${kind}: give the env class a fork() method`);
  }
  return Object.create(proto);
}

const isThenable = (value) => typeof value.then === 'function';

/** Copies `from`'s own properties (symbols, getters and non-enumerable ones included) onto `to`, values deep. */
function copyOwnProperties(from, to, seen) {
  for (const key of Reflect.ownKeys(from)) {
    const descriptor = Object.getOwnPropertyDescriptor(from, key);
    if ('value' in descriptor) descriptor.value = deepCopy(descriptor.value, seen);
    if (Array.isArray(to) && key === 'length') {
      to.length = descriptor.value;
      continue;
    }
    Object.defineProperty(to, key, descriptor);
  }
}

module.exports = { canFork, forkEnv, deepCopy };
