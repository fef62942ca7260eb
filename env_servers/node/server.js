#!/usr/bin/env node
'use strict';
// A Node.js env server for the roll_lightning env protocol (protos/roll_lightning/protocol/v1/env.proto):
// EnvService + grpc.health.v1 + server reflection, idle-session reaping, graceful drain on SIGTERM/SIGINT.
//
//   node env_servers/node/server.js [ENV_ID ...] --host 127.0.0.1 --port 0 [--max-sessions N]
//        [--session-ttl S] [--max-action-bytes N] [--drain-seconds S] [--seed N] [--token T]
//
// When ready it prints one JSON line on stdout, as `python -m env_servers serve` does:
//   {"event": "serving", "address": "127.0.0.1:PORT", "envs": [...], "server_id": "...", "pid": N, "tls": false}
// Logs go to stderr.

const fs = require('fs');
const path = require('path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');
const { HealthImplementation } = require('grpc-health-check');

const { REGISTRY, DEFAULT_ENVS } = require('./envs');
const { SessionTable } = require('./lib/sessions');
const { EnvService, guardedDefinition, SERVICE_NAME } = require('./lib/service');
const { addReflection } = require('./lib/reflection');

const PROTO_ROOT = process.env.ROLL_ENV_PROTO_ROOT || path.resolve(__dirname, '../../protos');
const ENV_PROTO = 'roll_lightning/protocol/v1/env.proto';
const LOADER_OPTIONS = {
  keepCase: true,
  longs: String, // uint64 (seed, tag) as decimal strings: full 64-bit values, BigInt inside
  enums: String,
  defaults: false, // absent fields stay undefined: `optional uint64 seed` keeps its presence
  oneofs: true,
  includeDirs: [PROTO_ROOT],
};

const DRAIN_CHECK_MS = 50; // how often the drain looks for episodes still in progress
const FLUSH_GRACE_MS = 1000; // once none is left: how long calls still open may take to finish

const USAGE = `usage: node server.js [ENV_ID ...] [options]

Serve env ids (default: ${DEFAULT_ENVS.join(', ')}) over gRPC.

options:
  --host HOST              address to bind; 0.0.0.0 for other hosts (default 127.0.0.1)
  --port PORT              0 picks a free port, printed on the ready line (default 50051)
  --max-sessions N         capacity; more gives RESOURCE_EXHAUSTED (default 4096)
  --session-ttl S          seconds before an idle session is closed (default 600)
  --max-action-bytes N     larger action texts are refused with INVALID_ARGUMENT (default 65536)
  --max-message-bytes N    gRPC message size limit (default 16 MiB)
  --drain-seconds S        on SIGTERM/SIGINT, the longest wait for episodes in progress to end (default 10)
  --seed N                 seed for server-drawn episode seeds (unseeded Resets)
  --token T                require 'authorization: Bearer T' (or set ROLL_ENV_TOKEN)
  --token-file PATH        read the bearer token from a file
  --tls-cert PATH          PEM certificate chain (enables TLS, with --tls-key)
  --tls-key PATH           PEM private key
`;

function fail(message) {
  process.stderr.write(`${USAGE}\nserver.js: error: ${message}\n`);
  process.exit(2);
}

function parseArgs(argv) {
  const opts = {
    envs: [],
    host: '127.0.0.1',
    port: 50051,
    maxSessions: 4096,
    sessionTtl: 600,
    maxActionBytes: 65536,
    maxMessageBytes: 16 * 1024 * 1024,
    drainSeconds: 10,
    seed: null,
    token: null,
    tokenFile: null,
    tlsCert: null,
    tlsKey: null,
  };
  const numeric = {
    '--port': ['port', 'int'],
    '--max-sessions': ['maxSessions', 'int'],
    '--session-ttl': ['sessionTtl', 'float'],
    '--max-action-bytes': ['maxActionBytes', 'int'],
    '--max-message-bytes': ['maxMessageBytes', 'int'],
    '--drain-seconds': ['drainSeconds', 'float'],
  };
  const strings = {
    '--host': 'host',
    '--token': 'token',
    '--token-file': 'tokenFile',
    '--tls-cert': 'tlsCert',
    '--tls-key': 'tlsKey',
    '--seed': 'seed',
  };
  for (let i = 0; i < argv.length; i += 1) {
    let arg = argv[i];
    if (arg === '-h' || arg === '--help') {
      process.stdout.write(USAGE);
      process.exit(0);
    }
    if (!arg.startsWith('--')) {
      opts.envs.push(arg);
      continue;
    }
    let value;
    const eq = arg.indexOf('=');
    if (eq >= 0) {
      value = arg.slice(eq + 1);
      arg = arg.slice(0, eq);
    }
    if (!(arg in numeric) && !(arg in strings)) fail(`unknown option ${arg}`);
    if (value === undefined) {
      if (i + 1 >= argv.length) fail(`${arg} needs a value`);
      value = argv[(i += 1)];
    }
    if (arg in strings) {
      opts[strings[arg]] = value;
    } else {
      const [key, kind] = numeric[arg];
      const number = Number(value);
      if (value.trim() === '' || !Number.isFinite(number) || (kind === 'int' && !Number.isInteger(number))) {
        fail(`${arg}: expected ${kind === 'int' ? 'an integer' : 'a number'}, got '${value}'`);
      }
      opts[key] = number;
    }
  }
  if (opts.envs.length === 0) opts.envs = [...DEFAULT_ENVS];
  for (const envId of opts.envs) {
    if (!REGISTRY.has(envId)) fail(`unknown env id '${envId}' (known: ${[...REGISTRY.keys()].join(', ')})`);
  }
  if (opts.port < 0 || opts.port > 65535) fail(`--port must be in 0..65535, got ${opts.port}`);
  if (opts.maxSessions < 1) fail(`--max-sessions must be >= 1, got ${opts.maxSessions}`);
  if (!(opts.sessionTtl > 0)) fail(`--session-ttl must be > 0, got ${opts.sessionTtl}`);
  if (opts.maxActionBytes < 1) fail(`--max-action-bytes must be >= 1, got ${opts.maxActionBytes}`);
  if ((opts.tlsCert === null) !== (opts.tlsKey === null)) fail('--tls-cert and --tls-key must be given together');
  if (opts.seed !== null) {
    if (!/^\d+$/.test(opts.seed)) fail(`--seed: expected a non-negative integer, got '${opts.seed}'`);
    opts.seed = BigInt(opts.seed);
  }
  if (opts.tokenFile !== null && !opts.token) opts.token = fs.readFileSync(opts.tokenFile, 'utf8').trim();
  opts.token = opts.token || process.env.ROLL_ENV_TOKEN || null;
  return opts;
}

const log = (message) => process.stderr.write(`${new Date().toISOString()} env_servers-node ${message}\n`);

/** JSON like Python's json.dumps (", " and ": " separators), for the ready line. */
function pyJson(object) {
  const value = (v) => (Array.isArray(v) ? `[${v.map((x) => JSON.stringify(x)).join(', ')}]` : JSON.stringify(v));
  return `{${Object.entries(object)
    .map(([k, v]) => `${JSON.stringify(k)}: ${value(v)}`)
    .join(', ')}}`;
}

function reflectionPackage() {
  const healthRoot = path.resolve(path.dirname(require.resolve('grpc-health-check')), '../../proto');
  const reflectionRoot = path.resolve(path.dirname(require.resolve('@grpc/reflection')), '../proto');
  const files = [
    ENV_PROTO,
    'health/v1/health.proto',
    'grpc/reflection/v1alpha/reflection.proto',
    'grpc/reflection/v1/reflection.proto',
  ];
  return protoLoader.loadSync(files, { ...LOADER_OPTIONS, includeDirs: [PROTO_ROOT, healthRoot, reflectionRoot] });
}

function main() {
  const opts = parseArgs(process.argv.slice(2));
  const packageDefinition = protoLoader.loadSync(ENV_PROTO, LOADER_OPTIONS);
  const entries = new Map(opts.envs.map((envId) => [envId, REGISTRY.get(envId)]));
  const table = new SessionTable(entries, {
    maxSessions: opts.maxSessions,
    sessionTtlS: opts.sessionTtl,
    seed: opts.seed,
  });
  const service = new EnvService(table, { maxActionBytes: opts.maxActionBytes, token: opts.token, log });
  const health = new HealthImplementation({ '': 'NOT_SERVING', [SERVICE_NAME]: 'NOT_SERVING' });
  const setHealth = (state) => {
    for (const name of ['', SERVICE_NAME]) health.setStatus(name, state);
  };

  const server = new grpc.Server({
    'grpc.max_receive_message_length': opts.maxMessageBytes,
    'grpc.max_send_message_length': opts.maxMessageBytes,
  });
  server.addService(guardedDefinition(packageDefinition[SERVICE_NAME]), service.handlers());
  health.addToServer(server);
  addReflection(server, reflectionPackage());

  const tls = opts.tlsCert !== null;
  const credentials = tls
    ? grpc.ServerCredentials.createSsl(null, [
        { private_key: fs.readFileSync(opts.tlsKey), cert_chain: fs.readFileSync(opts.tlsCert) },
      ])
    : grpc.ServerCredentials.createInsecure();
  const bracketed = opts.host.includes(':') && !opts.host.startsWith('[');
  const target = bracketed ? `[${opts.host}]:${opts.port}` : `${opts.host}:${opts.port}`;
  server.bindAsync(target, credentials, (err, port) => {
    if (err) {
      log(`could not bind ${target}: ${err.message}`);
      process.exit(1);
    }
    // Loading = building one env of each kind; only then advertise SERVING.
    for (const entry of entries.values()) entry.make(SessionTable.makeConfig(entry, undefined));
    setHealth('SERVING');
    const period = Math.min(30, Math.max(0.05, opts.sessionTtl / 4)) * 1000;
    const reaper = setInterval(() => {
      const closed = table.reapIdle();
      if (closed) log(`closed ${closed} idle sessions`);
    }, period);
    log(`serving ${opts.envs.join(',')} on ${opts.host}:${port}`);
    process.stdout.write(
      `${pyJson({
        event: 'serving',
        address: `${opts.host}:${port}`,
        envs: opts.envs,
        server_id: table.serverId,
        pid: process.pid,
        tls,
      })}\n`,
    );

    // Drain (proto header, "Draining"): NOT_SERVING and ServerInfo.draining at once; CreateSession and new
    // Resets are refused (UNAVAILABLE, "draining: ..."), everything else is served so that episodes in
    // progress finish. Stop as soon as no episode is in progress (checked every 50 ms), or when the drain
    // period is over, whichever comes first; only calls still open then are cut off.
    let draining = false;
    const drain = (signal) => {
      if (draining) return;
      draining = true;
      log(`${signal}: draining (up to ${opts.drainSeconds}s, or until no episode is in progress)`);
      service.draining = true;
      setHealth('NOT_SERVING');
      const deadline = Date.now() + opts.drainSeconds * 1000;
      const finish = () => {
        log('stopped');
        process.exit(0);
      };
      const cutOff = (why) => {
        log(`${why}: cancelling the calls still open`);
        server.forceShutdown();
        finish();
      };
      let stopping = false;
      let watch = null;
      const check = () => {
        if (stopping) return;
        const open = table.inProgress();
        if (open > 0 && Date.now() < deadline) return;
        stopping = true;
        if (watch !== null) clearInterval(watch);
        if (open > 0) {
          cutOff(`drain period over with ${open} episodes in progress`);
          return;
        }
        log('no episode in progress: stopping');
        // Answers already sent are flushed (tryShutdown waits for open calls); a call left open (an idle
        // Stream, a health Watch) is cut off after a short grace, never later than the drain period.
        const grace = Math.max(0, Math.min(FLUSH_GRACE_MS, deadline - Date.now()));
        const force = setTimeout(() => cutOff('calls still open'), grace);
        server.tryShutdown(() => {
          clearTimeout(force);
          finish();
        });
      };
      check();
      if (!stopping) {
        watch = setInterval(check, DRAIN_CHECK_MS);
        setTimeout(check, Math.max(0, deadline - Date.now())); // exact end of the drain period
      }
    };
    process.on('SIGTERM', () => drain('SIGTERM'));
    process.on('SIGINT', () => drain('SIGINT'));
  });
}

if (require.main === module) main();

module.exports = { parseArgs, LOADER_OPTIONS, PROTO_ROOT, ENV_PROTO };
