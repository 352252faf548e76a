from nanscope.format.proto import graph_debug_info_pb2 as _graph_debug_info_pb2
from nanscope.format.proto import tensor_pb2 as _tensor_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TensorDebugMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    UNSPECIFIED: _ClassVar[TensorDebugMode]
    NO_TENSOR: _ClassVar[TensorDebugMode]
    CURT_HEALTH: _ClassVar[TensorDebugMode]
    CONCISE_HEALTH: _ClassVar[TensorDebugMode]
    FULL_HEALTH: _ClassVar[TensorDebugMode]
    SHAPE: _ClassVar[TensorDebugMode]
    FULL_NUMERICS: _ClassVar[TensorDebugMode]
    FULL_TENSOR: _ClassVar[TensorDebugMode]
    REDUCE_INF_NAN_THREE_SLOTS: _ClassVar[TensorDebugMode]

class Phase(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PHASE_UNKNOWN: _ClassVar[Phase]
    PHASE_FORWARD: _ClassVar[Phase]
    PHASE_BACKWARD: _ClassVar[Phase]
    PHASE_OPTIMIZER: _ClassVar[Phase]
UNSPECIFIED: TensorDebugMode
NO_TENSOR: TensorDebugMode
CURT_HEALTH: TensorDebugMode
CONCISE_HEALTH: TensorDebugMode
FULL_HEALTH: TensorDebugMode
SHAPE: TensorDebugMode
FULL_NUMERICS: TensorDebugMode
FULL_TENSOR: TensorDebugMode
REDUCE_INF_NAN_THREE_SLOTS: TensorDebugMode
PHASE_UNKNOWN: Phase
PHASE_FORWARD: Phase
PHASE_BACKWARD: Phase
PHASE_OPTIMIZER: Phase

class DebugEvent(_message.Message):
    __slots__ = ("wall_time", "step", "debug_metadata", "source_file", "stack_frame_with_id", "graph_op_creation", "debugged_graph", "execution", "graph_execution_trace", "graph_id", "debugged_device")
    WALL_TIME_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    DEBUG_METADATA_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FILE_FIELD_NUMBER: _ClassVar[int]
    STACK_FRAME_WITH_ID_FIELD_NUMBER: _ClassVar[int]
    GRAPH_OP_CREATION_FIELD_NUMBER: _ClassVar[int]
    DEBUGGED_GRAPH_FIELD_NUMBER: _ClassVar[int]
    EXECUTION_FIELD_NUMBER: _ClassVar[int]
    GRAPH_EXECUTION_TRACE_FIELD_NUMBER: _ClassVar[int]
    GRAPH_ID_FIELD_NUMBER: _ClassVar[int]
    DEBUGGED_DEVICE_FIELD_NUMBER: _ClassVar[int]
    wall_time: float
    step: int
    debug_metadata: DebugMetadata
    source_file: SourceFile
    stack_frame_with_id: StackFrameWithId
    graph_op_creation: GraphOpCreation
    debugged_graph: DebuggedGraph
    execution: Execution
    graph_execution_trace: GraphExecutionTrace
    graph_id: str
    debugged_device: DebuggedDevice
    def __init__(self, wall_time: _Optional[float] = ..., step: _Optional[int] = ..., debug_metadata: _Optional[_Union[DebugMetadata, _Mapping]] = ..., source_file: _Optional[_Union[SourceFile, _Mapping]] = ..., stack_frame_with_id: _Optional[_Union[StackFrameWithId, _Mapping]] = ..., graph_op_creation: _Optional[_Union[GraphOpCreation, _Mapping]] = ..., debugged_graph: _Optional[_Union[DebuggedGraph, _Mapping]] = ..., execution: _Optional[_Union[Execution, _Mapping]] = ..., graph_execution_trace: _Optional[_Union[GraphExecutionTrace, _Mapping]] = ..., graph_id: _Optional[str] = ..., debugged_device: _Optional[_Union[DebuggedDevice, _Mapping]] = ...) -> None: ...

class DebugMetadata(_message.Message):
    __slots__ = ("tensorflow_version", "file_version", "tfdbg_run_id", "framework", "nanscope_version", "process_rank", "world_size", "pid", "tensor_debug_mode", "circular_buffer_size", "clock_wall", "clock_monotonic")
    TENSORFLOW_VERSION_FIELD_NUMBER: _ClassVar[int]
    FILE_VERSION_FIELD_NUMBER: _ClassVar[int]
    TFDBG_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    FRAMEWORK_FIELD_NUMBER: _ClassVar[int]
    NANSCOPE_VERSION_FIELD_NUMBER: _ClassVar[int]
    PROCESS_RANK_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    TENSOR_DEBUG_MODE_FIELD_NUMBER: _ClassVar[int]
    CIRCULAR_BUFFER_SIZE_FIELD_NUMBER: _ClassVar[int]
    CLOCK_WALL_FIELD_NUMBER: _ClassVar[int]
    CLOCK_MONOTONIC_FIELD_NUMBER: _ClassVar[int]
    tensorflow_version: str
    file_version: str
    tfdbg_run_id: str
    framework: str
    nanscope_version: str
    process_rank: int
    world_size: int
    pid: int
    tensor_debug_mode: TensorDebugMode
    circular_buffer_size: int
    clock_wall: float
    clock_monotonic: float
    def __init__(self, tensorflow_version: _Optional[str] = ..., file_version: _Optional[str] = ..., tfdbg_run_id: _Optional[str] = ..., framework: _Optional[str] = ..., nanscope_version: _Optional[str] = ..., process_rank: _Optional[int] = ..., world_size: _Optional[int] = ..., pid: _Optional[int] = ..., tensor_debug_mode: _Optional[_Union[TensorDebugMode, str]] = ..., circular_buffer_size: _Optional[int] = ..., clock_wall: _Optional[float] = ..., clock_monotonic: _Optional[float] = ...) -> None: ...

class SourceFile(_message.Message):
    __slots__ = ("file_path", "host_name", "lines")
    FILE_PATH_FIELD_NUMBER: _ClassVar[int]
    HOST_NAME_FIELD_NUMBER: _ClassVar[int]
    LINES_FIELD_NUMBER: _ClassVar[int]
    file_path: str
    host_name: str
    lines: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, file_path: _Optional[str] = ..., host_name: _Optional[str] = ..., lines: _Optional[_Iterable[str]] = ...) -> None: ...

class StackFrameWithId(_message.Message):
    __slots__ = ("id", "file_line_col")
    ID_FIELD_NUMBER: _ClassVar[int]
    FILE_LINE_COL_FIELD_NUMBER: _ClassVar[int]
    id: str
    file_line_col: _graph_debug_info_pb2.GraphDebugInfo.FileLineCol
    def __init__(self, id: _Optional[str] = ..., file_line_col: _Optional[_Union[_graph_debug_info_pb2.GraphDebugInfo.FileLineCol, _Mapping]] = ...) -> None: ...

class CodeLocation(_message.Message):
    __slots__ = ("host_name", "stack_frame_ids")
    HOST_NAME_FIELD_NUMBER: _ClassVar[int]
    STACK_FRAME_IDS_FIELD_NUMBER: _ClassVar[int]
    host_name: str
    stack_frame_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, host_name: _Optional[str] = ..., stack_frame_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class GraphOpCreation(_message.Message):
    __slots__ = ("op_type", "op_name", "graph_name", "graph_id", "device_name", "input_names", "num_outputs", "code_location", "output_tensor_ids", "module_path", "forward_code_location")
    OP_TYPE_FIELD_NUMBER: _ClassVar[int]
    OP_NAME_FIELD_NUMBER: _ClassVar[int]
    GRAPH_NAME_FIELD_NUMBER: _ClassVar[int]
    GRAPH_ID_FIELD_NUMBER: _ClassVar[int]
    DEVICE_NAME_FIELD_NUMBER: _ClassVar[int]
    INPUT_NAMES_FIELD_NUMBER: _ClassVar[int]
    NUM_OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    CODE_LOCATION_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TENSOR_IDS_FIELD_NUMBER: _ClassVar[int]
    MODULE_PATH_FIELD_NUMBER: _ClassVar[int]
    FORWARD_CODE_LOCATION_FIELD_NUMBER: _ClassVar[int]
    op_type: str
    op_name: str
    graph_name: str
    graph_id: str
    device_name: str
    input_names: _containers.RepeatedScalarFieldContainer[str]
    num_outputs: int
    code_location: CodeLocation
    output_tensor_ids: _containers.RepeatedScalarFieldContainer[int]
    module_path: str
    forward_code_location: CodeLocation
    def __init__(self, op_type: _Optional[str] = ..., op_name: _Optional[str] = ..., graph_name: _Optional[str] = ..., graph_id: _Optional[str] = ..., device_name: _Optional[str] = ..., input_names: _Optional[_Iterable[str]] = ..., num_outputs: _Optional[int] = ..., code_location: _Optional[_Union[CodeLocation, _Mapping]] = ..., output_tensor_ids: _Optional[_Iterable[int]] = ..., module_path: _Optional[str] = ..., forward_code_location: _Optional[_Union[CodeLocation, _Mapping]] = ...) -> None: ...

class DebuggedGraph(_message.Message):
    __slots__ = ("graph_id", "graph_name", "instrumented_ops", "original_graph_def", "instrumented_graph_def", "outer_context_id")
    GRAPH_ID_FIELD_NUMBER: _ClassVar[int]
    GRAPH_NAME_FIELD_NUMBER: _ClassVar[int]
    INSTRUMENTED_OPS_FIELD_NUMBER: _ClassVar[int]
    ORIGINAL_GRAPH_DEF_FIELD_NUMBER: _ClassVar[int]
    INSTRUMENTED_GRAPH_DEF_FIELD_NUMBER: _ClassVar[int]
    OUTER_CONTEXT_ID_FIELD_NUMBER: _ClassVar[int]
    graph_id: str
    graph_name: str
    instrumented_ops: _containers.RepeatedScalarFieldContainer[str]
    original_graph_def: bytes
    instrumented_graph_def: bytes
    outer_context_id: str
    def __init__(self, graph_id: _Optional[str] = ..., graph_name: _Optional[str] = ..., instrumented_ops: _Optional[_Iterable[str]] = ..., original_graph_def: _Optional[bytes] = ..., instrumented_graph_def: _Optional[bytes] = ..., outer_context_id: _Optional[str] = ...) -> None: ...

class DebuggedDevice(_message.Message):
    __slots__ = ("device_name", "device_id")
    DEVICE_NAME_FIELD_NUMBER: _ClassVar[int]
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    device_name: str
    device_id: int
    def __init__(self, device_name: _Optional[str] = ..., device_id: _Optional[int] = ...) -> None: ...

class Execution(_message.Message):
    __slots__ = ("op_type", "num_outputs", "graph_id", "input_tensor_ids", "output_tensor_ids", "tensor_debug_mode", "tensor_protos", "code_location", "output_tensor_device_ids", "module_path", "phase", "forward_sequence", "forward_code_location", "sequence", "input_tensor_protos", "collective", "output_ranges", "output_views", "output_statistics")
    OP_TYPE_FIELD_NUMBER: _ClassVar[int]
    NUM_OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    GRAPH_ID_FIELD_NUMBER: _ClassVar[int]
    INPUT_TENSOR_IDS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TENSOR_IDS_FIELD_NUMBER: _ClassVar[int]
    TENSOR_DEBUG_MODE_FIELD_NUMBER: _ClassVar[int]
    TENSOR_PROTOS_FIELD_NUMBER: _ClassVar[int]
    CODE_LOCATION_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TENSOR_DEVICE_IDS_FIELD_NUMBER: _ClassVar[int]
    MODULE_PATH_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    FORWARD_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    FORWARD_CODE_LOCATION_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    INPUT_TENSOR_PROTOS_FIELD_NUMBER: _ClassVar[int]
    COLLECTIVE_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_RANGES_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_VIEWS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_STATISTICS_FIELD_NUMBER: _ClassVar[int]
    op_type: str
    num_outputs: int
    graph_id: str
    input_tensor_ids: _containers.RepeatedScalarFieldContainer[int]
    output_tensor_ids: _containers.RepeatedScalarFieldContainer[int]
    tensor_debug_mode: TensorDebugMode
    tensor_protos: _containers.RepeatedCompositeFieldContainer[_tensor_pb2.TensorProto]
    code_location: CodeLocation
    output_tensor_device_ids: _containers.RepeatedScalarFieldContainer[int]
    module_path: str
    phase: Phase
    forward_sequence: int
    forward_code_location: CodeLocation
    sequence: int
    input_tensor_protos: _containers.RepeatedCompositeFieldContainer[_tensor_pb2.TensorProto]
    collective: CollectiveOp
    output_ranges: _containers.RepeatedScalarFieldContainer[float]
    output_views: _containers.RepeatedCompositeFieldContainer[ValueView]
    output_statistics: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, op_type: _Optional[str] = ..., num_outputs: _Optional[int] = ..., graph_id: _Optional[str] = ..., input_tensor_ids: _Optional[_Iterable[int]] = ..., output_tensor_ids: _Optional[_Iterable[int]] = ..., tensor_debug_mode: _Optional[_Union[TensorDebugMode, str]] = ..., tensor_protos: _Optional[_Iterable[_Union[_tensor_pb2.TensorProto, _Mapping]]] = ..., code_location: _Optional[_Union[CodeLocation, _Mapping]] = ..., output_tensor_device_ids: _Optional[_Iterable[int]] = ..., module_path: _Optional[str] = ..., phase: _Optional[_Union[Phase, str]] = ..., forward_sequence: _Optional[int] = ..., forward_code_location: _Optional[_Union[CodeLocation, _Mapping]] = ..., sequence: _Optional[int] = ..., input_tensor_protos: _Optional[_Iterable[_Union[_tensor_pb2.TensorProto, _Mapping]]] = ..., collective: _Optional[_Union[CollectiveOp, _Mapping]] = ..., output_ranges: _Optional[_Iterable[float]] = ..., output_views: _Optional[_Iterable[_Union[ValueView, _Mapping]]] = ..., output_statistics: _Optional[_Iterable[float]] = ...) -> None: ...

class ValueView(_message.Message):
    __slots__ = ("output_slot", "sequence", "slot", "offset", "shape", "strides", "counts")
    OUTPUT_SLOT_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    SLOT_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    STRIDES_FIELD_NUMBER: _ClassVar[int]
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    output_slot: int
    sequence: int
    slot: int
    offset: int
    shape: _containers.RepeatedScalarFieldContainer[int]
    strides: _containers.RepeatedScalarFieldContainer[int]
    counts: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, output_slot: _Optional[int] = ..., sequence: _Optional[int] = ..., slot: _Optional[int] = ..., offset: _Optional[int] = ..., shape: _Optional[_Iterable[int]] = ..., strides: _Optional[_Iterable[int]] = ..., counts: _Optional[_Iterable[int]] = ...) -> None: ...

class CollectiveOp(_message.Message):
    __slots__ = ("group", "group_desc", "group_size", "kind", "sequence", "peer", "framework_sequence")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    GROUP_DESC_FIELD_NUMBER: _ClassVar[int]
    GROUP_SIZE_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    PEER_FIELD_NUMBER: _ClassVar[int]
    FRAMEWORK_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    group: str
    group_desc: str
    group_size: int
    kind: str
    sequence: int
    peer: int
    framework_sequence: int
    def __init__(self, group: _Optional[str] = ..., group_desc: _Optional[str] = ..., group_size: _Optional[int] = ..., kind: _Optional[str] = ..., sequence: _Optional[int] = ..., peer: _Optional[int] = ..., framework_sequence: _Optional[int] = ...) -> None: ...

class GraphExecutionTrace(_message.Message):
    __slots__ = ("tfdbg_context_id", "op_name", "output_slot", "tensor_debug_mode", "tensor_proto", "device_name", "sequence", "iteration", "output_statistics")
    TFDBG_CONTEXT_ID_FIELD_NUMBER: _ClassVar[int]
    OP_NAME_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_SLOT_FIELD_NUMBER: _ClassVar[int]
    TENSOR_DEBUG_MODE_FIELD_NUMBER: _ClassVar[int]
    TENSOR_PROTO_FIELD_NUMBER: _ClassVar[int]
    DEVICE_NAME_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_STATISTICS_FIELD_NUMBER: _ClassVar[int]
    tfdbg_context_id: str
    op_name: str
    output_slot: int
    tensor_debug_mode: TensorDebugMode
    tensor_proto: _tensor_pb2.TensorProto
    device_name: str
    sequence: int
    iteration: int
    output_statistics: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, tfdbg_context_id: _Optional[str] = ..., op_name: _Optional[str] = ..., output_slot: _Optional[int] = ..., tensor_debug_mode: _Optional[_Union[TensorDebugMode, str]] = ..., tensor_proto: _Optional[_Union[_tensor_pb2.TensorProto, _Mapping]] = ..., device_name: _Optional[str] = ..., sequence: _Optional[int] = ..., iteration: _Optional[int] = ..., output_statistics: _Optional[_Iterable[float]] = ...) -> None: ...
