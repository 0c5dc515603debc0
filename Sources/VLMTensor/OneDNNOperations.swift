#if canImport(CDNNL) && !VLM_PORTABLE_BACKEND
internal import CDNNL

// The oneDNN backend of the ops in Operations.swift, which checks shapes and handles empty tensors first.

extension Activation {
    /// The oneDNN eltwise algorithm and its alpha/beta, nil for identity.
    var eltwise: (algorithm: dnnl_alg_kind_t, alpha: Float, beta: Float)? {
        switch self {
        case .identity: nil
        case .gelu: (dnnl_eltwise_gelu_erf, 0, 0)
        case .geluTanh: (dnnl_eltwise_gelu_tanh, 0, 0)
        // oneDNN's swish is x·sigmoid(alpha·x).
        case .quickGelu: (dnnl_eltwise_swish, 1.702, 0)
        case .relu: (dnnl_eltwise_relu, 0, 0)
        case .silu: (dnnl_eltwise_swish, 1, 0)
        case .sigmoid: (dnnl_eltwise_logistic, 0, 0)
        case .elu: (dnnl_eltwise_elu, 1, 0)
        }
    }

    var postOps: [PostOp] {
        eltwise.map { [.eltwise($0.algorithm, alpha: $0.alpha, beta: $0.beta)] } ?? []
    }
}

/// Shapes of the ops without weights; one cache serves them all.
private enum OperationKey: Hashable {
    case eltwise(count: Int, Activation)
    case eltwiseBackward(count: Int, Activation)
    case scale(count: Int, factor: Float)
    case add(rows: Int, columns: Int, broadcast: Bool)
    case softmax(rows: Int, columns: Int)
    case matmul(m: Int, k: Int, n: Int, transposeA: Bool, transposeB: Bool)
}

private let operationPrimitives = PrimitiveCache<OperationKey>(capacity: 512)

private func cachedPrimitive<Operation>(_ key: OperationKey, _ name: String, operation: () -> Operation) -> Primitive {
    cachedPrimitive(key, name) { (operation(), nil) }
}

/// A backward operation's primitive, created with the forward primitive it is the gradient of.
private func cachedPrimitive<Operation>(_ key: OperationKey, _ name: String, operation: () -> (Operation, forward: Primitive?)) -> Primitive {
    operationPrimitives.primitive(for: key) {
        let (descriptor, forward) = operation()
        guard let primitive = Primitive(name, operation: descriptor, forward: forward) else {
            fatalError("oneDNN has no implementation of \(name) for \(key)")
        }
        return primitive
    }
}

/// `kind` applied to the non-empty `x`, written to `output`; `kind` is not identity.
func oneDNNActivation(_ x: Tensor, _ kind: Activation, into output: Tensor) {
    let eltwise = kind.eltwise!
    oneDNNEltwise(x, into: output, key: .eltwise(count: x.count, kind), name: "\(kind) activation",
                  algorithm: eltwise.algorithm, alpha: eltwise.alpha, beta: eltwise.beta)
}

/// The gradient of `kind` at the non-empty `x`, given its output's `outputGradient`, written to `inputGradient`;
/// `kind` is not identity. oneDNN computes the derivative from the input (`use_src_for_bwd` algorithms' rule).
func oneDNNActivationBackward(_ outputGradient: Tensor, input x: Tensor, _ kind: Activation, into inputGradient: Tensor) {
    let eltwise = kind.eltwise!
    let primitive = cachedPrimitive(.eltwiseBackward(count: x.count, kind), "\(kind) activation gradient") {
        var data = memoryDescriptor([x.count])
        var forward = dnnl_eltwise_desc_t()
        checkDNNL(dnnl_eltwise_forward_desc_init(&forward, dnnl_forward_training, eltwise.algorithm, &data, eltwise.alpha, eltwise.beta),
                  "\(kind) activation descriptor [\(x.count)]")
        guard let hint = Primitive("\(kind) activation", operation: forward) else {
            fatalError("oneDNN has no implementation of the \(kind) activation for training")
        }
        var operation = dnnl_eltwise_desc_t()
        checkDNNL(dnnl_eltwise_backward_desc_init(&operation, eltwise.algorithm, &data, &data, eltwise.alpha, eltwise.beta),
                  "\(kind) activation gradient descriptor [\(x.count)]")
        return (operation, hint)
    }
    primitive.execute([(DNNL_ARG_SRC, x.rawPointer), (DNNL_ARG_DIFF_DST, outputGradient.rawPointer),
                       (DNNL_ARG_DIFF_SRC, inputGradient.rawPointer)])
}

func oneDNNScaled(_ x: Tensor, by factor: Float, into output: Tensor) {
    oneDNNEltwise(x, into: output, key: .scale(count: x.count, factor: factor), name: "scale", algorithm: dnnl_eltwise_linear,
                  alpha: factor, beta: 0)
}

private func oneDNNEltwise(_ x: Tensor, into output: Tensor, key: OperationKey, name: String, algorithm: dnnl_alg_kind_t,
                           alpha: Float, beta: Float) {
    let primitive = cachedPrimitive(key, name) {
        var data = memoryDescriptor([x.count])
        var operation = dnnl_eltwise_desc_t()
        checkDNNL(dnnl_eltwise_forward_desc_init(&operation, dnnl_forward_inference, algorithm, &data, alpha, beta),
                  "\(name) descriptor [\(x.count)]")
        return operation
    }
    primitive.execute([(DNNL_ARG_SRC, x.rawPointer), (DNNL_ARG_DST, output.rawPointer)])
}

/// `a [rows, columns] + b [columns]`, broadcast over the rows.
func oneDNNAdd(_ a: Tensor, _ b: Tensor, rows: Int, columns: Int, into output: Tensor) {
    let primitive = cachedPrimitive(.add(rows: rows, columns: columns, broadcast: rows > 1), "add") {
        var source0 = memoryDescriptor([rows, columns])
        var source1 = memoryDescriptor([1, columns])
        var destination = source0
        var operation = dnnl_binary_desc_t()
        checkDNNL(dnnl_binary_desc_init(&operation, dnnl_binary_add, &source0, &source1, &destination),
                  "add descriptor [\(rows), \(columns)] + [1, \(columns)]")
        return operation
    }
    primitive.execute([(DNNL_ARG_SRC_0, a.rawPointer), (DNNL_ARG_SRC_1, b.rawPointer), (DNNL_ARG_DST, output.rawPointer)])
}

/// Softmax of each of the `rows` rows of `columns` values.
func oneDNNSoftmax(_ x: Tensor, rows: Int, columns: Int, into output: Tensor) {
    let primitive = cachedPrimitive(.softmax(rows: rows, columns: columns), "softmax") {
        var data = memoryDescriptor([rows, columns])
        var operation = dnnl_softmax_v2_desc_t()
        checkDNNL(dnnl_softmax_v2_forward_desc_init(&operation, dnnl_forward_inference, dnnl_softmax_accurate, &data, &data, 1),
                  "softmax descriptor [\(rows), \(columns)]")
        return operation
    }
    primitive.execute([(DNNL_ARG_SRC, x.rawPointer), (DNNL_ARG_DST, output.rawPointer)])
}

/// `a · b`, `a` being `[m, k]`, or `[k, m]` when `transposeA`, and `b` `[k, n]`, or `[n, k]` when `transposeB`; `k > 0`.
func oneDNNMatmul(_ a: Tensor, _ b: Tensor, m: Int, k: Int, n: Int, transposeA: Bool, transposeB: Bool, into output: Tensor) {
    let primitive = cachedPrimitive(.matmul(m: m, k: k, n: n, transposeA: transposeA, transposeB: transposeB), "matmul") {
        var source = memoryDescriptor([m, k], strides: transposeA ? [1, m] : [k, 1])
        var weights = memoryDescriptor([k, n], strides: transposeB ? [1, k] : [n, 1])
        var destination = memoryDescriptor([m, n])
        var operation = dnnl_matmul_desc_t()
        checkDNNL(dnnl_matmul_desc_init(&operation, &source, &weights, nil, &destination), "matmul descriptor [\(m), \(k)] x [\(k), \(n)]")
        return operation
    }
    primitive.execute([(DNNL_ARG_SRC, a.rawPointer), (DNNL_ARG_WEIGHTS, b.rawPointer), (DNNL_ARG_DST, output.rawPointer)])
}

#endif
