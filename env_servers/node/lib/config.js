'use strict';
// Env configs: a field table -> parsing with defaults (naming any bad key) and a JSON Schema, like
// env_servers.api.parse_config / config_schema on the Python side.

const { stableStringify } = require('./values');

class ConfigError extends Error {}

function describeValue(value) {
  return value === undefined ? 'undefined' : JSON.stringify(value);
}

function coerce(field, value, where) {
  switch (field.type) {
    case 'boolean':
      if (typeof value === 'boolean') return value;
      throw new ConfigError(`${where}: expected a boolean, got ${describeValue(value)}`);
    case 'integer':
      // Struct numbers are doubles: integral numbers are accepted for integer fields.
      if (typeof value === 'number' && Number.isSafeInteger(value)) return value;
      throw new ConfigError(`${where}: expected an integer, got ${describeValue(value)}`);
    case 'number':
      if (typeof value === 'number' && Number.isFinite(value)) return value;
      throw new ConfigError(`${where}: expected a number, got ${describeValue(value)}`);
    case 'string':
      if (typeof value === 'string') return value;
      throw new ConfigError(`${where}: expected a string, got ${describeValue(value)}`);
    default:
      return value;
  }
}

/** `values` (a plain object, maybe undefined) -> a full config with defaults filled in; throws ConfigError. */
function parseConfig(fields, values, envId) {
  values = values || {};
  const known = Object.keys(fields).sort();
  const unknown = Object.keys(values).filter((k) => !(k in fields)).sort();
  if (unknown.length) {
    throw new ConfigError(`config.${unknown[0]}: unknown key for env '${envId}' (known: ${known.join(', ')})`);
  }
  const config = {};
  for (const name of Object.keys(fields)) {
    config[name] = name in values ? coerce(fields[name], values[name], `config.${name}`) : fields[name].default;
  }
  return config;
}

/** The JSON Schema (as text) of a config field table. */
function configSchema(fields) {
  const properties = {};
  for (const [name, field] of Object.entries(fields)) {
    const entry = { type: field.type };
    if (field.default !== undefined) entry.default = field.default;
    if (field.minimum !== undefined) entry.minimum = field.minimum;
    if (field.description) entry.description = field.description;
    properties[name] = entry;
  }
  return stableStringify({ type: 'object', additionalProperties: false, properties });
}

module.exports = { ConfigError, parseConfig, configSchema };
