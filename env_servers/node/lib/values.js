'use strict';
// Conversions between JS values and google.protobuf.Struct as @grpc/proto-loader presents it
// (keepCase, oneofs: true): {fields: {key: {kind: 'numberValue', numberValue: 3}}}.

function fromValue(value) {
  if (value == null) return null;
  const kind = value.kind || Object.keys(value).find((k) => k.endsWith('Value'));
  switch (kind) {
    case 'nullValue':
      return null;
    case 'numberValue':
      return Number(value.numberValue);
    case 'stringValue':
      return value.stringValue;
    case 'boolValue':
      return Boolean(value.boolValue);
    case 'structValue':
      return fromStruct(value.structValue);
    case 'listValue':
      return ((value.listValue && value.listValue.values) || []).map(fromValue);
    default:
      return null;
  }
}

/** A Struct message (or undefined) -> a plain object (or undefined when absent). */
function fromStruct(struct) {
  if (struct == null) return undefined;
  const out = {};
  for (const [key, value] of Object.entries(struct.fields || {})) out[key] = fromValue(value);
  return out;
}

function toValue(value) {
  if (value === null || value === undefined) return { nullValue: 'NULL_VALUE' };
  switch (typeof value) {
    case 'number':
      return { numberValue: value };
    case 'bigint':
      return { numberValue: Number(value) };
    case 'string':
      return { stringValue: value };
    case 'boolean':
      return { boolValue: value };
    default:
      if (Array.isArray(value)) return { listValue: { values: value.map(toValue) } };
      return { structValue: toStruct(value) };
  }
}

/** A plain object -> a Struct message. */
function toStruct(object) {
  const fields = {};
  for (const [key, value] of Object.entries(object || {})) {
    if (value !== undefined) fields[key] = toValue(value);
  }
  return { fields };
}

/** JSON text with sorted object keys (like Python's json.dumps(..., sort_keys=True)). */
function stableStringify(value) {
  return JSON.stringify(value, (key, v) => {
    if (v && typeof v === 'object' && !Array.isArray(v)) {
      return Object.fromEntries(Object.keys(v).sort().map((k) => [k, v[k]]));
    }
    return typeof v === 'bigint' ? v.toString() : v;
  });
}

module.exports = { fromStruct, toStruct, fromValue, toValue, stableStringify };
