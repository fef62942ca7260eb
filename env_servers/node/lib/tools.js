'use strict';
// Tool calls in a Step (env.proto's header, "Tools"), as env_servers/server/tools.py states them: the checks the
// runtime makes before the env sees a call, a small JSON Schema checker (the subset of env_servers/tool_schema.py:
// type, properties, required, additionalProperties, items, enum, minimum/maximum, minLength/maxLength), and the
// rule the env's results must keep (one per call it was given, with its id, in order; else never sent).
//
// The rule for a step with bad calls (an unknown tool, arguments that are not a JSON object or fail the tool's
// schema, an empty id or one shared by several calls): each bad call is answered here with an error result naming
// what was wrong, and the env never sees it. The env is still stepped with the text and the good calls only
// (possibly none); the step is then action_valid=false and its reward is the env's `bad_call_penalty` when it has
// one, else the spec's reward_min. A text env (no tools) given calls is stepped with the text, every call bad.

const { stableStringify } = require('./values');

class ToolRuleBroken extends Error {}

const TYPES = {
  object: (v) => v !== null && typeof v === 'object' && !Array.isArray(v),
  array: (v) => Array.isArray(v),
  string: (v) => typeof v === 'string',
  boolean: (v) => typeof v === 'boolean',
  null: (v) => v === null,
  number: (v) => typeof v === 'number',
  integer: (v) => Number.isInteger(v),
};

function jsonType(value) {
  for (const name of ['null', 'boolean', 'integer', 'number', 'string', 'array', 'object']) {
    if (TYPES[name](value)) return name;
  }
  return typeof value;
}

/** JSON equality for enum: deep, by value (1 equals 1.0 in JS anyway). */
const same = (a, b) => stableStringify(a) === stableStringify(b);

/** The first way `value` breaks `schema`, as a sentence naming the place (`arguments.x`); null if it fits. */
function schemaError(schema, value, where = 'arguments') {
  if (!TYPES.object(schema)) return null;
  if (schema.type !== undefined) {
    const names = Array.isArray(schema.type) ? schema.type : [schema.type];
    if (!names.some((name) => (TYPES[name] ? TYPES[name](value) : true))) {
      return `${where} must be ${names.join(' or ')}, got ${jsonType(value)}`;
    }
  }
  if (Array.isArray(schema.enum) && !schema.enum.some((option) => same(value, option))) {
    return `${where} must be one of ${JSON.stringify(schema.enum)}, got ${JSON.stringify(value)}`;
  }
  if (typeof value === 'number') {
    if (schema.minimum !== undefined && value < schema.minimum) {
      return `${where} must be >= ${schema.minimum}, got ${value}`;
    }
    if (schema.maximum !== undefined && value > schema.maximum) {
      return `${where} must be <= ${schema.maximum}, got ${value}`;
    }
  }
  if (typeof value === 'string') {
    const length = [...value].length; // code points, as Python counts
    if (schema.minLength !== undefined && length < schema.minLength) {
      return `${where} must have at least ${schema.minLength} characters`;
    }
    if (schema.maxLength !== undefined && length > schema.maxLength) {
      return `${where} must have at most ${schema.maxLength} characters`;
    }
  }
  if (TYPES.object(value)) return objectError(schema, value, where);
  if (Array.isArray(value) && TYPES.object(schema.items)) {
    for (const [i, item] of value.entries()) {
      const error = schemaError(schema.items, item, `${where}[${i}]`);
      if (error) return error;
    }
  }
  return null;
}

function objectError(schema, value, where) {
  const properties = TYPES.object(schema.properties) ? schema.properties : {};
  for (const name of Array.isArray(schema.required) ? schema.required : []) {
    if (!Object.prototype.hasOwnProperty.call(value, name)) return `${where}.${name} is required`;
  }
  const extra = schema.additionalProperties === undefined ? true : schema.additionalProperties;
  for (const [name, item] of Object.entries(value)) {
    let error = null;
    if (Object.prototype.hasOwnProperty.call(properties, name)) {
      error = schemaError(properties[name], item, `${where}.${name}`);
    } else if (extra === false) {
      const known = Object.keys(properties).sort().join(', ') || 'none';
      error = `${where}.${name} is not a known argument (known: ${known})`;
    } else if (TYPES.object(extra)) {
      error = schemaError(extra, item, `${where}.${name}`);
    }
    if (error) return error;
  }
  return null;
}

/** The tools of one env (name -> {name, description, parameters}), checked once; null for a text env. */
function toolBox(spec) {
  const tools = spec && Array.isArray(spec.tools) ? spec.tools : [];
  if (!tools.length) return null;
  const box = new Map();
  for (const tool of tools) {
    if (!tool || typeof tool.name !== 'string' || !tool.name || box.has(tool.name)) {
      throw new TypeError(`spec.tools: ${JSON.stringify(tool)} is not a tool with a non-empty, unique name`);
    }
    if (!TYPES.object(tool.parameters)) {
      throw new TypeError(`spec.tools: the parameters of '${tool.name}' must be a JSON Schema object`);
    }
    box.set(tool.name, tool);
  }
  return box;
}

/** EnvSpec.tools on the wire: the schema as JSON text (keys sorted, so the same tools give the same text). */
const toolsToWire = (box) =>
  box === null
    ? []
    : [...box.values()].map((tool) => ({
        name: tool.name,
        description: tool.description || '',
        parameters_json: stableStringify(tool.parameters),
      }));

/** What is wrong with one call in itself (not its id), or null; on success `call.arguments` is set, parsed. */
function callProblem(box, call) {
  const tool = box.get(call.name);
  if (tool === undefined) return [`unknown tool '${call.name}' (tools: ${[...box.keys()].join(', ')})`, null];
  let args;
  try {
    args = JSON.parse(call.arguments_json);
  } catch (err) {
    return [`the arguments of '${call.name}' are not JSON: ${err.message}`, null];
  }
  if (!TYPES.object(args)) {
    return [`the arguments of '${call.name}' must be a JSON object, got ${jsonType(args)}`, null];
  }
  const error = schemaError(tool.parameters, args);
  return error === null ? [null, args] : [`the arguments of '${call.name}' break its schema: ${error}`, null];
}

/**
 * The calls of a Step (wire ToolCall messages) -> {good, errors}: the good calls as the env sees them
 * ({id, name, arguments_json, arguments: parsed}) and, per call in order, the runtime's error result (null: good).
 */
function checkCalls(calls, box) {
  const counts = new Map();
  for (const call of calls) counts.set(call.id || '', (counts.get(call.id || '') || 0) + 1);
  const good = [];
  const errors = [];
  for (const raw of calls) {
    const call = { id: raw.id || '', name: raw.name || '', arguments_json: raw.arguments_json || '' };
    let problem = null;
    let args = null;
    if (!call.id) problem = 'the call has no id (ids are chosen by the client, unique within the step)';
    else if (counts.get(call.id) > 1) {
      problem = `call id '${call.id}' is used by ${counts.get(call.id)} calls in this step (ids must be unique)`;
    } else if (box === null) problem = `this env has no tools (unknown tool '${call.name}')`;
    else [problem, args] = callProblem(box, call);
    if (problem === null) {
      good.push({ ...call, arguments: args });
      errors.push(null);
    } else {
      errors.push({ call_id: call.id, name: call.name, content: problem, is_error: true });
    }
  }
  return { good, errors };
}

/** The step's results in call order: the env's for the good calls, the runtime's for the bad ones. */
function mergeResults(given, good, errors) {
  const results = given === undefined || given === null ? [] : given;
  if (!Array.isArray(results) || results.length !== good.length) {
    const count = Array.isArray(results) ? results.length : typeof results;
    throw new ToolRuleBroken(`the env was given ${good.length} tool calls and returned ${count} results (one each)`);
  }
  const out = [];
  let k = 0;
  for (const error of errors) {
    if (error !== null) {
      out.push(error);
      continue;
    }
    const call = good[k];
    const result = results[k];
    k += 1;
    if (!TYPES.object(result) || result.call_id !== call.id || typeof result.content !== 'string') {
      throw new ToolRuleBroken(
        `result ${JSON.stringify(result)} must be {call_id: '${call.id}', content: a string} (one per call, in order)`,
      );
    }
    const name = result.name || call.name;
    out.push({ call_id: call.id, name, content: result.content, is_error: Boolean(result.is_error) });
  }
  return out;
}

/** The reward of a step with a bad call: the env's `bad_call_penalty`, else its spec's reward_min. */
function badCallPenalty(env, spec) {
  const penalty = env && env.bad_call_penalty;
  return Number(penalty === undefined || penalty === null ? spec.reward_min : penalty);
}

module.exports = { ToolRuleBroken, schemaError, toolBox, toolsToWire, checkCalls, mergeResults, badCallPenalty };
