import VLMCheckpoint
import VLMTensor

/// Errors in a model's configuration that its weights cannot fix.
public enum ModelError: Error, CustomStringConvertible {
    case unsupportedModelType(String, supported: [String], file: String)
    /// A family known here asked for a task it does not serve.
    case wrongTask(ModelTask, family: String, modelType: String, supportedCommands: [String], file: String)
    case unsupportedActivation(String, file: String)
    case invalidConfig(String, file: String)
    case invalidInput(String)

    public var description: String {
        switch self {
        case .unsupportedModelType(let type, let supported, let file):
            return "\(file): model_type \"\(type)\" is not supported here (supported: \(supported.joined(separator: ", ")))"
        case .wrongTask(let task, let family, let modelType, let commands, let file):
            return "\(file): \(family) checkpoint (model_type \"\(modelType)\") cannot run `vlm \(task.command)`; it runs with \(commands.map { "vlm \($0)" }.joined(separator: ", "))"
        case .unsupportedActivation(let name, let file):
            return "\(file): hidden_act \"\(name)\" is not supported"
        case .invalidConfig(let message, let file):
            return "\(file): \(message)"
        case .invalidInput(let message):
            return message
        }
    }
}

extension Activation {
    /// The activation transformers' ACT2FN maps `name` to; `file` is the config the error names.
    public init(huggingFaceName name: String, file: String) throws {
        switch name {
        case "gelu": self = .gelu
        case "quick_gelu": self = .quickGelu
        case "gelu_new", "gelu_pytorch_tanh", "gelu_fast": self = .geluTanh
        case "relu": self = .relu
        case "silu", "swish": self = .silu
        case "sigmoid": self = .sigmoid
        default: throw ModelError.unsupportedActivation(name, file: file)
        }
    }
}

extension Linear {
    /// nn.Linear weights stored as `<scope>.weight` [out, in] and, when `bias`, `<scope>.bias` [out].
    convenience init(_ weights: Weights, inFeatures: Int, outFeatures: Int, bias: Bool = true) throws {
        try self.init(weight: weights("weight", shape: [outFeatures, inFeatures]),
                      bias: bias ? weights("bias", shape: [outFeatures]) : nil)
    }
}

/// nn.LayerNorm over the last dimension.
struct LayerNorm {
    let weight: Tensor
    let bias: Tensor
    let eps: Float

    init(_ weights: Weights, size: Int, eps: Float) throws {
        weight = try weights("weight", shape: [size])
        bias = try weights("bias", shape: [size])
        self.eps = eps
    }

    func callAsFunction(_ x: Tensor) -> Tensor { layerNorm(x, weight: weight, bias: bias, eps: eps) }
}

/// Multi-head self-attention over q_proj/k_proj/v_proj/out_proj weights (CLIP, SigLIP, ViT-style names).
///
/// The three input projections run as one Linear of width 3·D whose output the attention reads in place: one matrix
/// product instead of three.
struct SelfAttention {
    let queryKeyValue: Linear
    let output: Linear
    let heads: Int

    init(_ weights: Weights, hiddenSize: Int, heads: Int) throws {
        let projections = ["q_proj", "k_proj", "v_proj"].map(weights.scoped)
        queryKeyValue = try Linear(
            weight: concatenate(projections.map { try $0("weight", shape: [hiddenSize, hiddenSize]) }, axis: 0),
            bias: concatenate(projections.map { try $0("bias", shape: [hiddenSize]) }, axis: 0))
        output = try Linear(weights.scoped("out_proj"), inFeatures: hiddenSize, outFeatures: hiddenSize)
        self.heads = heads
    }

    /// An attention whose checkpoint stores the projections fused already (BLIP's `qkv` and `projection`).
    init(queryKeyValue: Linear, output: Linear, heads: Int) {
        self.queryKeyValue = queryKeyValue
        self.output = output
        self.heads = heads
    }

    /// Attention over `x` [B, T, D]; `residual` is added to the output projection (the pre-norm block's skip). In a
    /// layer built in bf16 the attention's own products take bf16 operands too.
    func callAsFunction(_ x: Tensor, causal: Bool, keyPaddingMask: Tensor?, residual: Tensor) -> Tensor {
        let context = attention(packedQKV: queryKeyValue(x), heads: heads, causal: causal, keyPaddingMask: keyPaddingMask,
                                precision: queryKeyValue.precision)
        return output(context, residual: residual)
    }

    /// Attention of one token per batch item, `positions[b]` of item `b`, over every token of `x` [B, T, D]: [B, D].
    /// `residual` [B, D] is added to the output projection.
    func callAsFunction(_ x: Tensor, at positions: [Int], causal: Bool, keyPaddingMask: Tensor?,
                        residual: Tensor) -> Tensor {
        let context = attention(packedQKV: queryKeyValue(x), heads: heads, queryPositions: positions, causal: causal,
                                keyPaddingMask: keyPaddingMask)
        return output(context, residual: residual)
    }
}

/// The two-layer MLP of a transformer block: fc2(act(fc1(x))).
struct FeedForward {
    let fc1: Linear
    let fc2: Linear
    let activation: Activation

    init(_ weights: Weights, hiddenSize: Int, intermediateSize: Int, activation: Activation) throws {
        fc1 = try Linear(weights.scoped("fc1"), inFeatures: hiddenSize, outFeatures: intermediateSize)
        fc2 = try Linear(weights.scoped("fc2"), inFeatures: intermediateSize, outFeatures: hiddenSize)
        self.activation = activation
    }

    func callAsFunction(_ x: Tensor, residual: Tensor) -> Tensor {
        fc2(fc1(x, activation: activation), residual: residual)
    }
}

/// A pre-norm encoder block (CLIP, SigLIP): x + attn(ln1(x)), then h + mlp(ln2(h)).
struct PreNormEncoderLayer {
    let layerNorm1: LayerNorm
    let selfAttention: SelfAttention
    let layerNorm2: LayerNorm
    let mlp: FeedForward

    init(_ weights: Weights, hiddenSize: Int, intermediateSize: Int, heads: Int, activation: Activation, eps: Float) throws {
        try self.init(weights, hiddenSize: hiddenSize, intermediateSize: intermediateSize, activation: activation, eps: eps,
                      selfAttention: SelfAttention(weights.scoped("self_attn"), hiddenSize: hiddenSize, heads: heads))
    }

    /// A block around an attention built from its own weight names (BLIP's fused `qkv`).
    init(_ weights: Weights, hiddenSize: Int, intermediateSize: Int, activation: Activation, eps: Float,
         selfAttention: SelfAttention) throws {
        layerNorm1 = try LayerNorm(weights.scoped("layer_norm1"), size: hiddenSize, eps: eps)
        self.selfAttention = selfAttention
        layerNorm2 = try LayerNorm(weights.scoped("layer_norm2"), size: hiddenSize, eps: eps)
        mlp = try FeedForward(weights.scoped("mlp"), hiddenSize: hiddenSize, intermediateSize: intermediateSize,
                              activation: activation)
    }

    /// Every token's output, [B, T, D].
    func callAsFunction(_ x: Tensor, causal: Bool = false, keyPaddingMask: Tensor? = nil) -> Tensor {
        let attended = selfAttention(layerNorm1(x), causal: causal, keyPaddingMask: keyPaddingMask, residual: x)
        return mlp(layerNorm2(attended), residual: attended)
    }

    /// The output of one token per batch item, `positions[b]` of item `b`, [B, D]: what a model that pools those
    /// tokens reads from its last layer. Keys and values come from every token; the other tokens' attention, output
    /// projection and MLP are skipped.
    func callAsFunction(_ x: Tensor, at positions: [Int], causal: Bool = false, keyPaddingMask: Tensor? = nil) -> Tensor {
        let attended = selfAttention(layerNorm1(x), at: positions, causal: causal, keyPaddingMask: keyPaddingMask,
                                     residual: gatherTokens(x, positions: positions))
        return mlp(layerNorm2(attended), residual: attended)
    }
}

extension PreNormEncoderLayer {
    /// A block from parts whose weights carry other names (ViLT's `layernorm_before`, `attention.attention.query`, …).
    init(layerNorm1: LayerNorm, selfAttention: SelfAttention, layerNorm2: LayerNorm, mlp: FeedForward) {
        self.layerNorm1 = layerNorm1
        self.selfAttention = selfAttention
        self.layerNorm2 = layerNorm2
        self.mlp = mlp
    }
}

extension FeedForward {
    /// An MLP from linear layers whose weights carry other names than `fc1`/`fc2`.
    init(fc1: Linear, fc2: Linear, activation: Activation) {
        self.fc1 = fc1
        self.fc2 = fc2
        self.activation = activation
    }
}

/// The encoder's last hidden state at `positions[b]` of each item `b` of `hidden` [B, T, D]: [B, D]. The last layer
/// computes only those rows (a pooled output reads nothing else).
func encode(_ hidden: Tensor, layers: [PreNormEncoderLayer], pooledAt positions: [Int], causal: Bool = false,
            keyPaddingMask: Tensor? = nil) -> Tensor {
    guard let last = layers.last else { return gatherTokens(hidden, positions: positions) }
    var hidden = hidden
    for layer in layers.dropLast() { hidden = layer(hidden, causal: causal, keyPaddingMask: keyPaddingMask) }
    return last(hidden, at: positions, causal: causal, keyPaddingMask: keyPaddingMask)
}

/// The text tower CLIP and SigLIP share (GroupViT, OWL-ViT and SigLIP 2 take theirs): learned token and position
/// embeddings, pre-norm encoder layers and a final layer norm, one token of each text pooled.
struct PreNormTextEncoder {
    let tokenEmbedding: Tensor
    let positionEmbedding: Tensor
    let layers: [PreNormEncoderLayer]
    let finalLayerNorm: LayerNorm
    /// The family, for error messages.
    let family: String

    /// Reads `embeddings.*`, `encoder.layers.*` and `final_layer_norm` under `weights`.
    init(_ weights: Weights, family: String, vocabSize: Int, hiddenSize: Int, intermediateSize: Int, heads: Int,
         layerCount: Int, maxPositions: Int, hiddenAct: String, eps: Float, file: String) throws {
        guard heads > 0, hiddenSize % heads == 0 else {
            throw ModelError.invalidConfig("text_config: hidden_size \(hiddenSize) is not a multiple of num_attention_heads \(heads)", file: file)
        }
        self.family = family
        tokenEmbedding = try weights("embeddings.token_embedding.weight", shape: [vocabSize, hiddenSize])
        positionEmbedding = try weights("embeddings.position_embedding.weight", shape: [maxPositions, hiddenSize])
        let activation = try Activation(huggingFaceName: hiddenAct, file: file)
        layers = try (0..<layerCount).map { i in
            try PreNormEncoderLayer(weights.scoped("encoder.layers.\(i)"), hiddenSize: hiddenSize,
                                    intermediateSize: intermediateSize, heads: heads, activation: activation, eps: eps)
        }
        finalLayerNorm = try LayerNorm(weights.scoped("final_layer_norm"), size: hiddenSize, eps: eps)
    }

    /// input_ids [B][T] (all rows the same length) and their attention mask (nil: every token) → the final-normed
    /// state of each text at `position(ids)` [B, D].
    func pooledOutput(inputIds: [[Int]], attentionMask: [[Int]]?, causal: Bool,
                      pooledAt position: ([Int]) -> Int) throws -> Tensor {
        let batch = inputIds.count
        let length = inputIds.first?.count ?? 0
        guard batch > 0, length > 0, inputIds.allSatisfy({ $0.count == length }) else {
            throw ModelError.invalidInput("\(family) text model expects a non-empty batch of equally long token sequences")
        }
        let (vocabularySize, d) = (tokenEmbedding.shape[0], tokenEmbedding.shape[1])
        guard length <= positionEmbedding.shape[0] else {
            throw ModelError.invalidInput("sequence of \(length) tokens exceeds max_position_embeddings \(positionEmbedding.shape[0])")
        }
        let flat = inputIds.flatMap { $0 }
        if let bad = flat.first(where: { $0 < 0 || $0 >= vocabularySize }) {
            throw ModelError.invalidInput("token id \(bad) is outside the vocabulary of \(vocabularySize)")
        }
        if let attentionMask, attentionMask.count != batch || attentionMask.contains(where: { $0.count != length }) {
            throw ModelError.invalidInput("attention mask is not [\(batch), \(length)] like the token ids")
        }
        let tokens = embedding(tokenEmbedding, ids: flat).reshaped([batch, length, d])
        let hidden = add(tokens, embedding(positionEmbedding, ids: Array(0..<length)))
        let mask = attentionMask.map { Tensor(shape: [batch, length], scalars: $0.flatMap { $0.map(Float.init) }) }
        return finalLayerNorm(encode(hidden, layers: layers, pooledAt: inputIds.map(position), causal: causal,
                                     keyPaddingMask: mask))
    }
}

/// A vision tower's `hidden_states[i]` for each `i` of `indices`: 0 is the `embeddings`, `i` the output of encoder
/// layer `i`, and a negative index counts from the end as Python's does. The embeddings are computed once the
/// indices are known to be valid, and layers past the deepest one asked for are not run.
func encoderHiddenStates(layers: [PreNormEncoderLayer], at indices: [Int],
                         embeddings: () throws -> Tensor) throws -> [Tensor] {
    let count = layers.count + 1
    let resolved = indices.map { $0 < 0 ? $0 + count : $0 }
    guard let deepest = resolved.max(), resolved.allSatisfy({ $0 >= 0 && $0 < count }) else {
        throw ModelError.invalidInput("vision hidden state indices \(indices) outside the \(count) the tower has (embeddings and \(layers.count) layers)")
    }
    var states = [try embeddings()]
    for layer in layers.prefix(deepest) { states.append(layer(states[states.count - 1])) }
    return resolved.map { states[$0] }
}

extension ModelDirectory {
    /// config.json's path, once its `model_type` is `type`: what a family's `init(directory:)` checks before reading
    /// anything else.
    ///
    /// - Throws: `ModelError.unsupportedModelType` naming config.json; the directory's errors for a missing or broken one.
    func configPath(checkingModelType type: String) throws -> String {
        let path = url.appendingPathComponent("config.json").path
        let found = try modelType
        guard found == type else { throw ModelError.unsupportedModelType(found, supported: [type], file: path) }
        return path
    }
}
