#if canImport(CDNNL) && !VLM_PORTABLE_BACKEND
internal import CDNNL
internal import Foundation

// The oneDNN machinery the oneDNN backend (the OneDNN*.swift files) builds on: the engine, the stream, memory
// descriptors, primitive creation and execution, and the primitive caches.

/// The process-wide oneDNN CPU engine and stream, and the scratchpad every primitive uses.
///
/// Primitives execute one at a time under `executionLock`: each one already spreads over every core through
/// oneDNN's OpenMP runtime, and a CPU stream is not meant to be shared between threads. One scratchpad therefore
/// serves them all. It is ours (`dnnl_scratchpad_mode_user`), not oneDNN's: the library's own is allocated per
/// thread when a primitive is created, so a primitive executed on another thread than the one that created it (any
/// model called from more than one task) would find none there, or one too small.
final class OneDNNRuntime: @unchecked Sendable {
    static let shared = OneDNNRuntime()

    let engine: dnnl_engine_t
    let stream: dnnl_stream_t
    private let executionLock = NSLock()
    private var scratchpad: UnsafeMutableRawPointer?
    private var scratchpadBytes = 0

    private init() {
        var engine: dnnl_engine_t?
        checkDNNL(dnnl_engine_create(&engine, dnnl_cpu, 0), "engine creation")
        var stream: dnnl_stream_t?
        checkDNNL(dnnl_stream_create(&stream, engine, dnnl_stream_default_flags.rawValue), "stream creation")
        self.engine = engine!
        self.stream = stream!
    }

    /// Runs `body` alone, with the scratchpad grown to at least `scratchpadBytes` (nil when none is needed).
    func serialized<R>(scratchpadBytes needed: Int, _ body: (UnsafeMutableRawPointer?) -> R) -> R {
        executionLock.lock()
        defer { executionLock.unlock() }
        if needed > scratchpadBytes {
            free(scratchpad)
            var raw: UnsafeMutableRawPointer?
            let status = posix_memalign(&raw, 64, needed)
            precondition(status == 0 && raw != nil, "out of memory allocating a \(needed)-byte oneDNN scratchpad")
            (scratchpad, scratchpadBytes) = (raw, needed)
        }
        return body(needed > 0 ? scratchpad : nil)
    }
}

/// A non-success oneDNN status means SwiftVLM built an invalid descriptor: a bug, never bad user input.
func checkDNNL(_ status: dnnl_status_t, _ what: @autoclosure () -> String) {
    if status != dnnl_success {
        fatalError("oneDNN \(what()) failed with status \(status.rawValue)")
    }
}

/// Row-major strides for `dims`.
func contiguousStrides(_ dims: [Int]) -> [Int] {
    var strides = [Int](repeating: 1, count: dims.count)
    var stride = 1
    for axis in dims.indices.reversed() {
        strides[axis] = stride
        stride *= dims[axis]
    }
    return strides
}

private func dnnlDims(_ values: [Int]) -> dnnl_dims_t {
    precondition(values.count <= Int(DNNL_MAX_NDIMS), "oneDNN supports at most \(DNNL_MAX_NDIMS) dimensions, got \(values)")
    var dims: dnnl_dims_t = (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
    withUnsafeMutableBytes(of: &dims) { raw in
        let slots = raw.bindMemory(to: dnnl_dim_t.self)
        for (index, value) in values.enumerated() { slots[index] = dnnl_dim_t(value) }
    }
    return dims
}

/// A memory descriptor with explicit strides (row-major when `strides` is nil), fp32 unless `type` says otherwise.
func memoryDescriptor(_ dims: [Int], strides: [Int]? = nil, type: dnnl_data_type_t = dnnl_f32) -> dnnl_memory_desc_t {
    var descriptor = dnnl_memory_desc_t()
    var dimsValue = dnnlDims(dims)
    var stridesValue = dnnlDims(strides ?? contiguousStrides(dims))
    let status = withUnsafePointer(to: &dimsValue) { dimsPointer in
        withUnsafePointer(to: &stridesValue) { stridesPointer in
            dimsPointer.withMemoryRebound(to: dnnl_dim_t.self, capacity: dims.count) { d in
                stridesPointer.withMemoryRebound(to: dnnl_dim_t.self, capacity: dims.count) { s in
                    dnnl_memory_desc_init_by_strides(&descriptor, Int32(dims.count), d, type, s)
                }
            }
        }
    }
    checkDNNL(status, "memory descriptor \(dims) strides \(strides ?? contiguousStrides(dims))")
    return descriptor
}

/// A memory descriptor in a named layout, `dnnl_format_tag_any` to let the primitive choose; fp32 unless `type` says
/// otherwise.
func memoryDescriptor(_ dims: [Int], tag: dnnl_format_tag_t, type: dnnl_data_type_t = dnnl_f32) -> dnnl_memory_desc_t {
    var descriptor = dnnl_memory_desc_t()
    var dimsValue = dnnlDims(dims)
    let status = withUnsafePointer(to: &dimsValue) { dimsPointer in
        dimsPointer.withMemoryRebound(to: dnnl_dim_t.self, capacity: dims.count) { d in
            dnnl_memory_desc_init_by_tag(&descriptor, Int32(dims.count), d, type, tag)
        }
    }
    checkDNNL(status, "memory descriptor \(dims) tag \(tag.rawValue)")
    return descriptor
}

func descriptorsEqual(_ a: dnnl_memory_desc_t, _ b: dnnl_memory_desc_t) -> Bool {
    withUnsafePointer(to: a) { pa in withUnsafePointer(to: b) { pb in dnnl_memory_desc_equal(pa, pb) != 0 } }
}

/// `DNNL_ARG_ATTR_MULTIPLE_POST_OP(index) | DNNL_ARG_SRC_1`: the second input of the binary post-op at `index`.
func postOpSource(_ index: Int) -> Int32 {
    DNNL_ARG_ATTR_MULTIPLE_POST_OP_BASE * Int32(index + 1) | DNNL_ARG_SRC_1
}

/// What a primitive does after its main computation, in order.
enum PostOp {
    /// oneDNN eltwise algorithm applied to the result.
    case eltwise(dnnl_alg_kind_t, alpha: Float, beta: Float)
    /// Adds a second tensor described by the descriptor (broadcast where its dims are 1).
    case add(dnnl_memory_desc_t)
    /// Multiplies by a second tensor described by the descriptor (broadcast where its dims are 1).
    case multiply(dnnl_memory_desc_t)
}

/// Primitive attributes: output scales, post-ops, and always the user-managed scratchpad (see `OneDNNRuntime`).
struct PrimitiveAttributes {
    /// Factors the result is multiplied by before the post-ops: one per index of the dimensions in `mask` (a bit
    /// per dimension), e.g. an int8 product's weight scale per output channel.
    var outputScales: (mask: Int32, values: [Float])?
    var postOps: [PostOp] = []

    func withHandle<R>(_ body: (dnnl_primitive_attr_t?) -> R) -> R {
        var attr: dnnl_primitive_attr_t?
        checkDNNL(dnnl_primitive_attr_create(&attr), "attribute creation")
        defer { dnnl_primitive_attr_destroy(attr) }
        checkDNNL(dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user), "scratchpad mode")
        if let (mask, values) = outputScales {
            checkDNNL(dnnl_primitive_attr_set_output_scales(attr, dnnl_dim_t(values.count), mask, values), "output scales")
        }
        if postOps.isEmpty { return body(attr) }
        var ops: dnnl_post_ops_t?
        checkDNNL(dnnl_post_ops_create(&ops), "post-op creation")
        defer { dnnl_post_ops_destroy(ops) }
        for op in postOps {
            switch op {
            case let .eltwise(algorithm, alpha, beta):
                checkDNNL(dnnl_post_ops_append_eltwise(ops, 1, algorithm, alpha, beta), "eltwise post-op")
            case var .add(descriptor):
                checkDNNL(dnnl_post_ops_append_binary(ops, dnnl_binary_add, &descriptor), "binary add post-op")
            case var .multiply(descriptor):
                checkDNNL(dnnl_post_ops_append_binary(ops, dnnl_binary_mul, &descriptor), "binary multiply post-op")
            }
        }
        checkDNNL(dnnl_primitive_attr_set_post_ops(attr, ops), "setting post-ops")
        return body(attr)
    }
}

/// A created oneDNN primitive together with its descriptor; immutable and safe to execute from any thread.
final class Primitive: @unchecked Sendable {
    let name: String
    private let descriptor: dnnl_primitive_desc_t
    private let handle: dnnl_primitive_t
    /// What the primitive needs of the shared scratchpad.
    private let scratchpad: (descriptor: dnnl_memory_desc_t, bytes: Int)

    /// Creates the primitive for an operation descriptor (a `dnnl_*_desc_t`), or nil when oneDNN has no
    /// implementation for it; a backward operation names the forward one it is the gradient of (`forward`).
    init?<OperationDescriptor>(_ name: String, operation: OperationDescriptor, attributes: PrimitiveAttributes = PrimitiveAttributes(),
                               forward: Primitive? = nil) {
        let runtime = OneDNNRuntime.shared
        var operation = operation
        var pd: dnnl_primitive_desc_t?
        let status = attributes.withHandle { attr in
            withUnsafePointer(to: &operation) {
                dnnl_primitive_desc_create(&pd, UnsafeRawPointer($0), attr, runtime.engine, forward?.descriptor)
            }
        }
        if status == dnnl_unimplemented { return nil }
        checkDNNL(status, "\(name) primitive descriptor")
        var primitive: dnnl_primitive_t?
        checkDNNL(dnnl_primitive_create(&primitive, pd), "\(name) primitive")
        self.name = name
        descriptor = pd!
        handle = primitive!
        scratchpad = Primitive.scratchpad(of: pd!)
    }

    /// A reorder from one layout to another.
    init(reorderFrom source: dnnl_memory_desc_t, to destination: dnnl_memory_desc_t) {
        let engine = OneDNNRuntime.shared.engine
        var source = source, destination = destination
        var pd: dnnl_primitive_desc_t?
        PrimitiveAttributes().withHandle { attr in
            checkDNNL(dnnl_reorder_primitive_desc_create(&pd, &source, engine, &destination, engine, attr), "reorder descriptor")
        }
        var primitive: dnnl_primitive_t?
        checkDNNL(dnnl_primitive_create(&primitive, pd), "reorder primitive")
        name = "reorder"
        descriptor = pd!
        handle = primitive!
        scratchpad = Primitive.scratchpad(of: pd!)
    }

    private static func scratchpad(of descriptor: dnnl_primitive_desc_t) -> (descriptor: dnnl_memory_desc_t, bytes: Int) {
        guard let md = dnnl_primitive_desc_query_md(descriptor, dnnl_query_scratchpad_md, 0) else {
            return (dnnl_memory_desc_t(), 0)
        }
        var scratchpad = md.pointee
        return (scratchpad, dnnl_memory_desc_get_size(&scratchpad))
    }

    deinit {
        dnnl_primitive_destroy(handle)
        dnnl_primitive_desc_destroy(descriptor)
    }

    /// The descriptor of an execution argument (`DNNL_ARG_*`), as the primitive chose it.
    func descriptor(for argument: Int32) -> dnnl_memory_desc_t {
        guard let md = dnnl_primitive_desc_query_md(descriptor, dnnl_query_exec_arg_md, argument) else {
            fatalError("oneDNN \(name): no descriptor for argument \(argument)")
        }
        return md.pointee
    }

    /// The implementation oneDNN picked, e.g. "brg:avx512_core".
    var implementation: String {
        var info: UnsafePointer<CChar>?
        checkDNNL(dnnl_primitive_desc_query(descriptor, dnnl_query_impl_info_str, 0, &info), "\(name) implementation query")
        return String(cString: info!)
    }

    /// Runs the primitive on raw buffers, one per argument, laid out as `descriptor(for:)` says.
    func execute(_ arguments: [(Int32, UnsafeMutableRawPointer)]) {
        let runtime = OneDNNRuntime.shared
        var execArgs: [dnnl_exec_arg_t] = []
        execArgs.reserveCapacity(arguments.count)
        for (argument, pointer) in arguments {
            var md = descriptor(for: argument)
            var memory: dnnl_memory_t?
            checkDNNL(dnnl_memory_create(&memory, &md, runtime.engine, pointer), "\(name) memory for argument \(argument)")
            execArgs.append(dnnl_exec_arg_t(arg: argument, memory: memory))
        }
        defer { for arg in execArgs { dnnl_memory_destroy(arg.memory) } }
        runtime.serialized(scratchpadBytes: scratchpad.bytes) { buffer in
            var all = execArgs
            if let buffer {
                var md = scratchpad.descriptor
                var memory: dnnl_memory_t?
                checkDNNL(dnnl_memory_create(&memory, &md, runtime.engine, buffer), "\(name) scratchpad memory")
                all.append(dnnl_exec_arg_t(arg: DNNL_ARG_SCRATCHPAD, memory: memory))
            }
            defer { if all.count > execArgs.count { dnnl_memory_destroy(all[all.count - 1].memory) } }
            checkDNNL(dnnl_primitive_execute(handle, runtime.stream, Int32(all.count), all), "\(name) execution")
            checkDNNL(dnnl_stream_wait(runtime.stream), "\(name) stream wait")
        }
    }
}

/// Primitives keyed by shape, created once and reused. Bounded: when full it starts over, so shapes that change
/// on every call (a growing decoder sequence) cannot make it grow without limit.
final class PrimitiveCache<Key: Hashable>: @unchecked Sendable {
    private var primitives: [Key: Primitive] = [:]
    private let lock = NSLock()
    private let capacity: Int

    init(capacity: Int = 256) { self.capacity = capacity }

    /// The primitive for `key`; `create` returning nil (no implementation for the layouts SwiftVLM asked for) is a
    /// bug, reported with `what`.
    func primitive(for key: Key, _ what: @autoclosure () -> String, create: () -> Primitive?) -> Primitive {
        primitive(for: key) {
            guard let created = create() else { fatalError("oneDNN has no \(what())") }
            return created
        }
    }

    func primitive(for key: Key, create: () -> Primitive) -> Primitive {
        lock.lock()
        defer { lock.unlock() }
        if let cached = primitives[key] { return cached }
        let created = create()
        if primitives.count >= capacity { primitives.removeAll(keepingCapacity: true) }
        primitives[key] = created
        return created
    }
}

/// What a Linear layer's primitive depends on besides its weights.
struct LinearCall: Hashable {
    let rows: Int
    let activation: Activation
    let residual: Bool
}

/// A 64-byte aligned buffer in a oneDNN-chosen layout (packed weights, blocked intermediate results).
final class PackedBuffer: @unchecked Sendable {
    let pointer: UnsafeMutableRawPointer
    let descriptor: dnnl_memory_desc_t

    /// An uninitialized buffer for `descriptor`; a `weight` lies with the model's others (see `allocateWeightMemory`).
    init(descriptor: dnnl_memory_desc_t, weight: Bool = false) {
        var md = descriptor
        let byteCount = dnnl_memory_desc_get_size(&md)
        pointer = allocateWeightMemory(byteCount: byteCount, sideBySide: weight)
        self.descriptor = descriptor
    }

    /// A weight: `source` (laid out as `sourceDescriptor`) reordered into `descriptor`'s layout.
    convenience init(descriptor: dnnl_memory_desc_t, from source: UnsafeMutableRawPointer, sourceDescriptor: dnnl_memory_desc_t) {
        self.init(descriptor: descriptor, weight: true)
        let reorder = Primitive(reorderFrom: sourceDescriptor, to: descriptor)
        reorder.execute([(DNNL_ARG_FROM, source), (DNNL_ARG_TO, pointer)])
    }

    deinit { releaseWeightMemory(pointer) }
}

extension Tensor {
    /// The storage as the untyped pointer oneDNN's memory objects take. oneDNN only reads inputs.
    var rawPointer: UnsafeMutableRawPointer { UnsafeMutableRawPointer(storage.pointer) }
}

#endif
