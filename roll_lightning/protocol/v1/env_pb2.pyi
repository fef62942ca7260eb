from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Status(_message.Message):
    __slots__ = ("code", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class GetServerInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ServerInfo(_message.Message):
    __slots__ = ("protocol_version", "server_id", "env_ids", "max_sessions", "active_sessions", "draining", "max_action_bytes", "session_ttl_s", "implementation", "capabilities")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    SERVER_ID_FIELD_NUMBER: _ClassVar[int]
    ENV_IDS_FIELD_NUMBER: _ClassVar[int]
    MAX_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    MAX_ACTION_BYTES_FIELD_NUMBER: _ClassVar[int]
    SESSION_TTL_S_FIELD_NUMBER: _ClassVar[int]
    IMPLEMENTATION_FIELD_NUMBER: _ClassVar[int]
    CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    protocol_version: str
    server_id: str
    env_ids: _containers.RepeatedScalarFieldContainer[str]
    max_sessions: int
    active_sessions: int
    draining: bool
    max_action_bytes: int
    session_ttl_s: float
    implementation: str
    capabilities: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, protocol_version: _Optional[str] = ..., server_id: _Optional[str] = ..., env_ids: _Optional[_Iterable[str]] = ..., max_sessions: _Optional[int] = ..., active_sessions: _Optional[int] = ..., draining: _Optional[bool] = ..., max_action_bytes: _Optional[int] = ..., session_ttl_s: _Optional[float] = ..., implementation: _Optional[str] = ..., capabilities: _Optional[_Iterable[str]] = ...) -> None: ...

class DescribeEnvRequest(_message.Message):
    __slots__ = ("env_id", "config")
    ENV_ID_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    env_id: str
    config: _struct_pb2.Struct
    def __init__(self, env_id: _Optional[str] = ..., config: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...

class EnvSpec(_message.Message):
    __slots__ = ("env_id", "version", "instruction", "action_format", "example_action", "max_steps", "reward_min", "reward_max", "deterministic", "splits", "config_schema", "config", "metrics", "tools", "max_sessions", "forkable")
    class SplitsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    ENV_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    INSTRUCTION_FIELD_NUMBER: _ClassVar[int]
    ACTION_FORMAT_FIELD_NUMBER: _ClassVar[int]
    EXAMPLE_ACTION_FIELD_NUMBER: _ClassVar[int]
    MAX_STEPS_FIELD_NUMBER: _ClassVar[int]
    REWARD_MIN_FIELD_NUMBER: _ClassVar[int]
    REWARD_MAX_FIELD_NUMBER: _ClassVar[int]
    DETERMINISTIC_FIELD_NUMBER: _ClassVar[int]
    SPLITS_FIELD_NUMBER: _ClassVar[int]
    CONFIG_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    MAX_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    FORKABLE_FIELD_NUMBER: _ClassVar[int]
    env_id: str
    version: str
    instruction: str
    action_format: str
    example_action: str
    max_steps: int
    reward_min: float
    reward_max: float
    deterministic: bool
    splits: _containers.ScalarMap[str, int]
    config_schema: str
    config: _struct_pb2.Struct
    metrics: _containers.RepeatedScalarFieldContainer[str]
    tools: _containers.RepeatedCompositeFieldContainer[Tool]
    max_sessions: int
    forkable: bool
    def __init__(self, env_id: _Optional[str] = ..., version: _Optional[str] = ..., instruction: _Optional[str] = ..., action_format: _Optional[str] = ..., example_action: _Optional[str] = ..., max_steps: _Optional[int] = ..., reward_min: _Optional[float] = ..., reward_max: _Optional[float] = ..., deterministic: _Optional[bool] = ..., splits: _Optional[_Mapping[str, int]] = ..., config_schema: _Optional[str] = ..., config: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., metrics: _Optional[_Iterable[str]] = ..., tools: _Optional[_Iterable[_Union[Tool, _Mapping]]] = ..., max_sessions: _Optional[int] = ..., forkable: _Optional[bool] = ...) -> None: ...

class Tool(_message.Message):
    __slots__ = ("name", "description", "parameters_json")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_JSON_FIELD_NUMBER: _ClassVar[int]
    name: str
    description: str
    parameters_json: str
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ..., parameters_json: _Optional[str] = ...) -> None: ...

class CreateSessionRequest(_message.Message):
    __slots__ = ("env_id", "config", "request_id", "client_tag")
    ENV_ID_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_TAG_FIELD_NUMBER: _ClassVar[int]
    env_id: str
    config: _struct_pb2.Struct
    request_id: str
    client_tag: str
    def __init__(self, env_id: _Optional[str] = ..., config: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., request_id: _Optional[str] = ..., client_tag: _Optional[str] = ...) -> None: ...

class CreateSessionResponse(_message.Message):
    __slots__ = ("session_id", "spec")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    spec: EnvSpec
    def __init__(self, session_id: _Optional[str] = ..., spec: _Optional[_Union[EnvSpec, _Mapping]] = ...) -> None: ...

class ForkSessionRequest(_message.Message):
    __slots__ = ("session_id", "copies", "request_id", "client_tag")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    COPIES_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_TAG_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    copies: int
    request_id: str
    client_tag: str
    def __init__(self, session_id: _Optional[str] = ..., copies: _Optional[int] = ..., request_id: _Optional[str] = ..., client_tag: _Optional[str] = ...) -> None: ...

class ForkedSession(_message.Message):
    __slots__ = ("session_id", "episode_id")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    EPISODE_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    episode_id: str
    def __init__(self, session_id: _Optional[str] = ..., episode_id: _Optional[str] = ...) -> None: ...

class ForkSessionResponse(_message.Message):
    __slots__ = ("forks", "step_index")
    FORKS_FIELD_NUMBER: _ClassVar[int]
    STEP_INDEX_FIELD_NUMBER: _ClassVar[int]
    forks: _containers.RepeatedCompositeFieldContainer[ForkedSession]
    step_index: int
    def __init__(self, forks: _Optional[_Iterable[_Union[ForkedSession, _Mapping]]] = ..., step_index: _Optional[int] = ...) -> None: ...

class CloseSessionRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class CloseSessionResponse(_message.Message):
    __slots__ = ("existed",)
    EXISTED_FIELD_NUMBER: _ClassVar[int]
    existed: bool
    def __init__(self, existed: _Optional[bool] = ...) -> None: ...

class Image(_message.Message):
    __slots__ = ("data", "media_type")
    DATA_FIELD_NUMBER: _ClassVar[int]
    MEDIA_TYPE_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    media_type: str
    def __init__(self, data: _Optional[bytes] = ..., media_type: _Optional[str] = ...) -> None: ...

class ResetRequest(_message.Message):
    __slots__ = ("session_id", "seed", "options", "request_id")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    seed: int
    options: _struct_pb2.Struct
    request_id: str
    def __init__(self, session_id: _Optional[str] = ..., seed: _Optional[int] = ..., options: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., request_id: _Optional[str] = ...) -> None: ...

class ResetResult(_message.Message):
    __slots__ = ("status", "session_id", "episode_id", "seed", "observation", "info", "images")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    EPISODE_ID_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_FIELD_NUMBER: _ClassVar[int]
    INFO_FIELD_NUMBER: _ClassVar[int]
    IMAGES_FIELD_NUMBER: _ClassVar[int]
    status: Status
    session_id: str
    episode_id: str
    seed: int
    observation: str
    info: _struct_pb2.Struct
    images: _containers.RepeatedCompositeFieldContainer[Image]
    def __init__(self, status: _Optional[_Union[Status, _Mapping]] = ..., session_id: _Optional[str] = ..., episode_id: _Optional[str] = ..., seed: _Optional[int] = ..., observation: _Optional[str] = ..., info: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., images: _Optional[_Iterable[_Union[Image, _Mapping]]] = ...) -> None: ...

class Action(_message.Message):
    __slots__ = ("text", "tool_calls")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    text: str
    tool_calls: _containers.RepeatedCompositeFieldContainer[ToolCall]
    def __init__(self, text: _Optional[str] = ..., tool_calls: _Optional[_Iterable[_Union[ToolCall, _Mapping]]] = ...) -> None: ...

class ToolCall(_message.Message):
    __slots__ = ("id", "name", "arguments_json")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_JSON_FIELD_NUMBER: _ClassVar[int]
    id: str
    name: str
    arguments_json: str
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., arguments_json: _Optional[str] = ...) -> None: ...

class ToolResult(_message.Message):
    __slots__ = ("call_id", "name", "content", "is_error")
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    IS_ERROR_FIELD_NUMBER: _ClassVar[int]
    call_id: str
    name: str
    content: str
    is_error: bool
    def __init__(self, call_id: _Optional[str] = ..., name: _Optional[str] = ..., content: _Optional[str] = ..., is_error: _Optional[bool] = ...) -> None: ...

class StepRequest(_message.Message):
    __slots__ = ("session_id", "episode_id", "step_index", "action", "request_id")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    EPISODE_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_INDEX_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    episode_id: str
    step_index: int
    action: Action
    request_id: str
    def __init__(self, session_id: _Optional[str] = ..., episode_id: _Optional[str] = ..., step_index: _Optional[int] = ..., action: _Optional[_Union[Action, _Mapping]] = ..., request_id: _Optional[str] = ...) -> None: ...

class StepResult(_message.Message):
    __slots__ = ("status", "session_id", "episode_id", "step_index", "observation", "reward", "terminated", "truncated", "action_valid", "info", "metrics", "env_seconds", "images", "tool_results")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    STATUS_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    EPISODE_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_INDEX_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    TERMINATED_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    ACTION_VALID_FIELD_NUMBER: _ClassVar[int]
    INFO_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    ENV_SECONDS_FIELD_NUMBER: _ClassVar[int]
    IMAGES_FIELD_NUMBER: _ClassVar[int]
    TOOL_RESULTS_FIELD_NUMBER: _ClassVar[int]
    status: Status
    session_id: str
    episode_id: str
    step_index: int
    observation: str
    reward: float
    terminated: bool
    truncated: bool
    action_valid: bool
    info: _struct_pb2.Struct
    metrics: _containers.ScalarMap[str, float]
    env_seconds: float
    images: _containers.RepeatedCompositeFieldContainer[Image]
    tool_results: _containers.RepeatedCompositeFieldContainer[ToolResult]
    def __init__(self, status: _Optional[_Union[Status, _Mapping]] = ..., session_id: _Optional[str] = ..., episode_id: _Optional[str] = ..., step_index: _Optional[int] = ..., observation: _Optional[str] = ..., reward: _Optional[float] = ..., terminated: _Optional[bool] = ..., truncated: _Optional[bool] = ..., action_valid: _Optional[bool] = ..., info: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., metrics: _Optional[_Mapping[str, float]] = ..., env_seconds: _Optional[float] = ..., images: _Optional[_Iterable[_Union[Image, _Mapping]]] = ..., tool_results: _Optional[_Iterable[_Union[ToolResult, _Mapping]]] = ...) -> None: ...

class BatchResetRequest(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[ResetRequest]
    def __init__(self, items: _Optional[_Iterable[_Union[ResetRequest, _Mapping]]] = ...) -> None: ...

class BatchResetResponse(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[ResetResult]
    def __init__(self, items: _Optional[_Iterable[_Union[ResetResult, _Mapping]]] = ...) -> None: ...

class BatchStepRequest(_message.Message):
    __slots__ = ("items", "resets")
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    RESETS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[StepRequest]
    resets: _containers.RepeatedCompositeFieldContainer[ResetRequest]
    def __init__(self, items: _Optional[_Iterable[_Union[StepRequest, _Mapping]]] = ..., resets: _Optional[_Iterable[_Union[ResetRequest, _Mapping]]] = ...) -> None: ...

class BatchStepResponse(_message.Message):
    __slots__ = ("items", "resets")
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    RESETS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[StepResult]
    resets: _containers.RepeatedCompositeFieldContainer[ResetResult]
    def __init__(self, items: _Optional[_Iterable[_Union[StepResult, _Mapping]]] = ..., resets: _Optional[_Iterable[_Union[ResetResult, _Mapping]]] = ...) -> None: ...

class StreamRequest(_message.Message):
    __slots__ = ("tag", "reset", "step")
    TAG_FIELD_NUMBER: _ClassVar[int]
    RESET_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    tag: int
    reset: ResetRequest
    step: StepRequest
    def __init__(self, tag: _Optional[int] = ..., reset: _Optional[_Union[ResetRequest, _Mapping]] = ..., step: _Optional[_Union[StepRequest, _Mapping]] = ...) -> None: ...

class StreamResponse(_message.Message):
    __slots__ = ("tag", "reset", "step")
    TAG_FIELD_NUMBER: _ClassVar[int]
    RESET_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    tag: int
    reset: ResetResult
    step: StepResult
    def __init__(self, tag: _Optional[int] = ..., reset: _Optional[_Union[ResetResult, _Mapping]] = ..., step: _Optional[_Union[StepResult, _Mapping]] = ...) -> None: ...
