'use strict';
// Server reflection (grpc.reflection.v1 and v1alpha) with @grpc/reflection, fed complete file descriptors.
//
// @grpc/proto-loader describes each *package* as one file (e.g. "roll_lightning_env_v1.proto") and leaves
// the files' `dependency` lists empty, so a client that builds descriptors from reflection (grpcurl, Python's
// DescriptorPool over ProtoReflectionDescriptorDatabase) cannot resolve imported types such as
// google.protobuf.Struct. We fill the dependency lists in (from the type references), mark proto3 `optional`
// fields as such, and hand the fixed descriptors to @grpc/reflection.

const { ReflectionService } = require('@grpc/reflection');
const { FileDescriptorProto } = require('protobufjs/ext/descriptor');

function indexSymbols(file, symbols) {
  const prefix = file.package ? `${file.package}.` : '';
  const visitMessage = (message, scope) => {
    const name = `${scope}${message.name}`;
    symbols.set(name, file.name);
    for (const nested of message.nestedType || []) visitMessage(nested, `${name}.`);
    for (const e of message.enumType || []) symbols.set(`${name}.${e.name}`, file.name);
  };
  for (const message of file.messageType || []) visitMessage(message, prefix);
  for (const e of file.enumType || []) symbols.set(`${prefix}${e.name}`, file.name);
  for (const service of file.service || []) symbols.set(`${prefix}${service.name}`, file.name);
}

/** The file defining `ref` as seen from `scope` (protobuf name resolution: innermost scope first). */
function resolve(ref, scope, symbols) {
  if (!ref) return undefined;
  if (ref.startsWith('.')) return symbols.get(ref.slice(1));
  const parts = scope ? scope.split('.') : [];
  for (let i = parts.length; i >= 0; i -= 1) {
    const candidate = [...parts.slice(0, i), ref].join('.');
    if (symbols.has(candidate)) return symbols.get(candidate);
  }
  return undefined;
}

function fixFile(file, symbols) {
  const deps = new Set(file.dependency || []);
  const use = (ref, scope) => {
    const owner = resolve(ref, scope, symbols);
    if (owner && owner !== file.name) deps.add(owner);
  };
  const visitMessage = (message, scope) => {
    const name = scope ? `${scope}.${message.name}` : message.name;
    const oneofs = message.oneofDecl || [];
    for (const field of message.field || []) {
      use(field.typeName, name);
      // proto3 `optional x` = a synthetic oneof named `_x` holding only x.
      const oneof = field.oneofIndex !== undefined && field.oneofIndex !== null ? oneofs[field.oneofIndex] : null;
      const members = (message.field || []).filter((f) => f.oneofIndex === field.oneofIndex);
      if (oneof && oneof.name === `_${field.name}` && members.length === 1) field.proto3Optional = true;
    }
    for (const nested of message.nestedType || []) visitMessage(nested, name);
  };
  for (const message of file.messageType || []) visitMessage(message, file.package || '');
  for (const service of file.service || []) {
    for (const method of service.method || []) {
      use(method.inputType, file.package || '');
      use(method.outputType, file.package || '');
    }
  }
  file.dependency = [...deps].sort();
  return file;
}

/** A package definition whose file descriptors have their dependencies filled in. */
function completeDescriptors(packageDefinition) {
  const files = new Map();
  for (const definition of Object.values(packageDefinition)) {
    for (const bytes of definition.fileDescriptorProtos || []) {
      const file = FileDescriptorProto.decode(bytes);
      if (file.name && !files.has(file.name)) files.set(file.name, file);
    }
  }
  const symbols = new Map();
  for (const file of files.values()) indexSymbols(file, symbols);
  const fixed = [...files.values()].map((file) => FileDescriptorProto.encode(fixFile(file, symbols)).finish());
  return { descriptors: { fileDescriptorProtos: fixed } };
}

/** Add reflection for every service of `packageDefinition` (loaded from all the served protos). */
function addReflection(server, packageDefinition) {
  new ReflectionService(completeDescriptors(packageDefinition)).addToServer(server);
}

module.exports = { addReflection, completeDescriptors };
