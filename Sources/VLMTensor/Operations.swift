internal import CDNNL
internal import CVLMKernels

/// Shapes of the ops without weights; one cache serves them all.
private enum OperationKey: Hashable {
    case eltwise(count: Int, Activation)
    case scale(count: Int, factor: Float)
    case add(rows: Int, columns: Int, broadcast: Bool)
    case softmax(rows: Int, columns: Int)
    case matmul(m: Int, k: Int, n: Int, transposeB: Bool)
}

private let operationPrimitives = PrimitiveCache<OperationKey>(capacity: 512)

private func cachedPrimitive<Operation>(_ key: OperationKey, _ name: String, operation: () -> Operation) -> Primitive {
    operationPrimitives.primitive(for: key) {
        guard let primitive = Primitive(name, operation: operation()) else {
            fatalError("oneDNN has no implementation of \(name) for \(key)")
        }
        return primitive
    }
}

/// Layer normalization over the last dimension (`torch.nn.functional.layer_norm(x, [D], weight, bias, eps)`).
public func layerNorm(_ x: Tensor, weight: Tensor, bias: Tensor, eps: Float) -> Tensor {
    layerNorm(x, weight: weight, bias: bias, eps: eps, path: .best)
}

/// Rows per layer-norm work unit. One image's 50 tokens stay on the calling thread: splitting 20 µs of work saves
/// 10 µs on an idle machine, but a parallel region waits for its slowest thread, which on a busy machine can be
/// a whole scheduler time slice away.
private let layerNormRowsPerUnit = 64

func layerNorm(_ x: Tensor, weight: Tensor, bias: Tensor, eps: Float, path: KernelPath) -> Tensor {
    let features = x.shape.last ?? 0
    precondition(x.rank >= 1 && weight.shape == [features] && bias.shape == [features],
                 "layerNorm of \(x.shape) needs weight and bias [\(features)], got \(weight.shape) and \(bias.shape)")
    let output = Tensor(uninitialized: x.shape)
    if x.count == 0 { return output }
    let rows = x.count / features
    let units = (rows + layerNormRowsPerUnit - 1) / layerNormRowsPerUnit
    let run: @Sendable (Int) -> Void = { unit in
        let first = unit * layerNormRowsPerUnit
        let count = min(layerNormRowsPerUnit, rows - first)
        vlm_layer_norm(x.storage.pointer + first * features, output.storage.pointer + first * features, count, features,
                       weight.storage.pointer, bias.storage.pointer, eps, path.isa)
    }
    if units == 1 {
        run(0)
    } else {
        parallelFor(units, run)
    }
    return output
}

/// Applies an activation function elementwise.
public func activation(_ x: Tensor, _ kind: Activation) -> Tensor {
    guard let eltwise = kind.eltwise else { return x }
    return eltwiseOperation(x, key: .eltwise(count: x.count, kind), name: "\(kind) activation",
                            algorithm: eltwise.algorithm, alpha: eltwise.alpha, beta: eltwise.beta)
}

/// `x * factor`.
public func scaled(_ x: Tensor, by factor: Float) -> Tensor {
    eltwiseOperation(x, key: .scale(count: x.count, factor: factor), name: "scale", algorithm: dnnl_eltwise_linear, alpha: factor, beta: 0)
}

private func eltwiseOperation(_ x: Tensor, key: OperationKey, name: String, algorithm: dnnl_alg_kind_t, alpha: Float, beta: Float) -> Tensor {
    let output = Tensor(uninitialized: x.shape)
    if x.count == 0 { return output }
    let primitive = cachedPrimitive(key, name) {
        var data = memoryDescriptor([x.count])
        var operation = dnnl_eltwise_desc_t()
        checkDNNL(dnnl_eltwise_forward_desc_init(&operation, dnnl_forward_inference, algorithm, &data, alpha, beta),
                  "\(name) descriptor [\(x.count)]")
        return operation
    }
    primitive.execute([(DNNL_ARG_SRC, x.rawPointer), (DNNL_ARG_DST, output.rawPointer)])
    return output
}

/// `a + b` where `b` has `a`'s shape or a suffix of it (then it is broadcast over `a`'s leading dimensions).
public func add(_ a: Tensor, _ b: Tensor) -> Tensor {
    precondition(b.rank <= a.rank && Array(a.shape.suffix(b.rank)) == b.shape,
                 "add: \(b.shape) is neither \(a.shape) nor a suffix of it")
    let output = Tensor(uninitialized: a.shape)
    if a.count == 0 { return output }
    let columns = b.count
    let rows = a.count / columns
    let broadcast = rows > 1
    let primitive = cachedPrimitive(.add(rows: rows, columns: columns, broadcast: broadcast), "add") {
        var source0 = memoryDescriptor([rows, columns])
        var source1 = memoryDescriptor([1, columns])
        var destination = source0
        var operation = dnnl_binary_desc_t()
        checkDNNL(dnnl_binary_desc_init(&operation, dnnl_binary_add, &source0, &source1, &destination),
                  "add descriptor [\(rows), \(columns)] + [1, \(columns)]")
        return operation
    }
    primitive.execute([(DNNL_ARG_SRC_0, a.rawPointer), (DNNL_ARG_SRC_1, b.rawPointer), (DNNL_ARG_DST, output.rawPointer)])
    return output
}

/// Softmax over the last dimension.
public func softmax(_ x: Tensor) -> Tensor {
    let output = Tensor(uninitialized: x.shape)
    if x.count == 0 { return output }
    let columns = x.shape.last!
    let rows = x.count / columns
    let primitive = cachedPrimitive(.softmax(rows: rows, columns: columns), "softmax") {
        softmaxOperation(memoryDescriptor([rows, columns]), axis: 1)
    }
    primitive.execute([(DNNL_ARG_SRC, x.rawPointer), (DNNL_ARG_DST, output.rawPointer)])
    return output
}

func softmaxOperation(_ data: dnnl_memory_desc_t, axis: Int) -> dnnl_softmax_v2_desc_t {
    var data = data
    var operation = dnnl_softmax_v2_desc_t()
    checkDNNL(dnnl_softmax_v2_forward_desc_init(&operation, dnnl_forward_inference, dnnl_softmax_accurate, &data, &data, Int32(axis)),
              "softmax descriptor")
    return operation
}

/// `x / ‖x‖₂` over the last dimension (`x / x.norm(p=2, dim=-1, keepdim=True)`).
public func l2Normalized(_ x: Tensor) -> Tensor {
    let output = Tensor(uninitialized: x.shape)
    if x.count == 0 { return output }
    let columns = x.shape.last!
    let rows = x.count / columns
    let source = x.storage.pointer
    let destination = output.storage.pointer
    for row in 0..<rows {
        let input = source + row * columns
        // Accumulating in Double makes the norm correctly rounded, which PyTorch's float reduction approximates.
        var sumOfSquares = 0.0
        for column in 0..<columns { sumOfSquares += Double(input[column]) * Double(input[column]) }
        let norm = Float(sumOfSquares.squareRoot())
        for column in 0..<columns { destination[row * columns + column] = input[column] / norm }
    }
    return output
}

/// Matrix product of 2-D tensors: `a [M, K] · b [K, N]`, or `a · bᵀ` with `b [N, K]` when `transposeB`.
public func matmul(_ a: Tensor, _ b: Tensor, transposeB: Bool = false) -> Tensor {
    precondition(a.rank == 2 && b.rank == 2, "matmul needs 2-D tensors, got \(a.shape) and \(b.shape)")
    let (m, k) = (a.shape[0], a.shape[1])
    let n = transposeB ? b.shape[0] : b.shape[1]
    precondition((transposeB ? b.shape[1] : b.shape[0]) == k,
                 "matmul: \(a.shape) x \(b.shape)\(transposeB ? "ᵀ" : "") do not line up")
    let output = Tensor(uninitialized: [m, n])
    if output.count == 0 { return output }
    if k == 0 { return Tensor(zeros: [m, n]) }
    let primitive = cachedPrimitive(.matmul(m: m, k: k, n: n, transposeB: transposeB), "matmul") {
        var source = memoryDescriptor([m, k])
        var weights = memoryDescriptor([k, n], strides: transposeB ? [1, k] : [n, 1])
        var destination = memoryDescriptor([m, n])
        var operation = dnnl_matmul_desc_t()
        checkDNNL(dnnl_matmul_desc_init(&operation, &source, &weights, nil, &destination), "matmul descriptor [\(m), \(k)] x [\(k), \(n)]")
        return operation
    }
    primitive.execute([(DNNL_ARG_SRC, a.rawPointer), (DNNL_ARG_WEIGHTS, b.rawPointer), (DNNL_ARG_DST, output.rawPointer)])
    return output
}
