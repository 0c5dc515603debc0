import Foundation
import VLMCheckpoint
import VLMTensor

// Llama-family decoders from llama.cpp GGUF files: the config from `llama.*` metadata, tensors renamed to Hugging
// Face's names.

extension LlamaConfig {
    /// The config transformers builds from a GGUF file's `llama.*` metadata (integrations/ggml.py): tied embeddings
    /// when the file has no `output.weight`, the vocabulary from `llama.vocab_size` or the tokenizer's token list.
    public init(gguf file: GGUFFile) throws {
        let path = file.url.path
        func invalid(_ reason: String) -> CheckpointError { .invalidGGUF(file: path, tensor: nil, reason: reason) }
        guard let architecture = file.metadata["general.architecture"]?.string else {
            throw invalid("general.architecture is missing")
        }
        guard architecture == "llama" || architecture == "mistral" else {
            throw invalid("general.architecture is \"\(architecture)\", not a Llama-family decoder (llama, mistral)")
        }
        func integer(_ key: String) throws -> Int? {
            guard let value = file.metadata["\(architecture).\(key)"] else { return nil }
            guard let integer = value.integer, integer >= 0 else { throw invalid("\(architecture).\(key) is \(value), expected a count") }
            return integer
        }
        func requiredInteger(_ key: String) throws -> Int {
            guard let value = try integer(key) else { throw invalid("\(architecture).\(key) is missing") }
            return value
        }
        hiddenSize = try requiredInteger("embedding_length")
        numHiddenLayers = try requiredInteger("block_count")
        numAttentionHeads = try requiredInteger("attention.head_count")
        numKeyValueHeads = try integer("attention.head_count_kv") ?? numAttentionHeads
        intermediateSize = try requiredInteger("feed_forward_length")
        maxPositionEmbeddings = try integer("context_length") ?? 2048
        headDim = try integer("rope.dimension_count") ?? (numAttentionHeads > 0 ? hiddenSize / numAttentionHeads : 0)
        rmsNormEps = Float(file.metadata["\(architecture).attention.layer_norm_rms_epsilon"]?.number ?? 1e-6)
        let theta = file.metadata["\(architecture).rope.freq_base"]?.number ?? 10000
        rope = RopeParameters(theta: theta)
        if let size = try integer("vocab_size") {
            vocabSize = size
        } else if let tokens = file.metadata["tokenizer.ggml.tokens"]?.array {
            vocabSize = tokens.count
        } else {
            throw invalid("neither \(architecture).vocab_size nor tokenizer.ggml.tokens gives the vocabulary size")
        }
        hiddenAct = "silu"
        tieWordEmbeddings = file.info("output.weight") == nil
        attentionBias = file.info("blk.0.attn_q.bias") != nil
        mlpBias = file.info("blk.0.ffn_gate.bias") != nil
        bosTokenId = file.metadata["tokenizer.ggml.bos_token_id"]?.integer
        eosTokenIds = file.metadata["tokenizer.ggml.eos_token_id"]?.integer.map { [$0] } ?? []
    }
}

extension LlamaForCausalLM {
    /// Loads a llama.cpp GGUF file: config from its metadata, and the query and key rows put back in Hugging Face's
    /// order (llama.cpp's converter interleaves each head's rotary halves; this undoes it as transformers'
    /// `LlamaTensorProcessor` does). Quantized matrices stay quantized and are read from the mapped file (the
    /// query and key rows are reordered in a quantized copy); norms and float matrices are fp32.
    public convenience init(gguf url: URL) throws {
        let file = try GGUFFile(url: url)
        let config = try LlamaConfig(gguf: file)
        func heads(_ ggufName: String) -> Int? {
            if ggufName.contains(".attn_q.") { return config.numAttentionHeads }
            if ggufName.contains(".attn_k.") { return config.numKeyValueHeads }
            return nil
        }
        try self.init(config: config, file: url.path, tensor: { name, shape in
            let ggufName = try Self.ggufName(for: name, file: url.path)
            let tensor = try file.tensor(ggufName, shape: shape)
            guard let heads = heads(ggufName) else { return tensor }
            return Self.unpermuteRotaryRows(tensor, heads: heads)
        }, matrix: { name, shape in
            let ggufName = try Self.ggufName(for: name, file: url.path)
            let matrix = try file.matrix(ggufName, shape: shape)
            guard let heads = heads(ggufName) else { return matrix }
            switch matrix {
            case let .dense(tensor): return .dense(Self.unpermuteRotaryRows(tensor, heads: heads))
            case let .quantized(quantized):
                return .quantized(quantized.permutingRows(Self.rotaryRowOrder(rows: shape[0], heads: heads)))
            }
        })
    }

    static func ggufName(for name: String, file: String) throws -> String {
        let fixed = ["model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
                     "lm_head.weight": "output.weight"]
        if let mapped = fixed[name] { return mapped }
        let parts = name.split(separator: ".", maxSplits: 3).map(String.init)
        let modules = ["input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
                       "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
                       "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
                       "mlp.down_proj": "ffn_down"]
        if parts.count == 4, parts[0] == "model", parts[1] == "layers", let rest = parts.last {
            let module = rest.split(separator: ".").dropLast().joined(separator: ".")
            let kind = rest.split(separator: ".").last.map(String.init) ?? ""
            if let mapped = modules[module] { return "blk.\(parts[2]).\(mapped).\(kind)" }
        }
        throw CheckpointError.missingTensor(file: file, tensor: name)
    }

    /// Hugging Face row `h·2d + j·d + i` is GGUF row `h·2d + 2i + j` within each head of `2d` rows (j ∈ {0, 1}):
    /// element `r` is the GGUF row that becomes Hugging Face row `r`.
    static func rotaryRowOrder(rows: Int, heads: Int) -> [Int] {
        let half = rows / heads / 2
        var order = [Int](repeating: 0, count: rows)
        for head in 0..<heads {
            for pair in 0..<half {
                for j in 0..<2 { order[head * 2 * half + j * half + pair] = head * 2 * half + 2 * pair + j }
            }
        }
        return order
    }

    static func unpermuteRotaryRows(_ tensor: Tensor, heads: Int) -> Tensor {
        let rows = tensor.shape[0]
        let rowLength = tensor.count / max(rows, 1)
        let result = Tensor(uninitialized: tensor.shape)
        for (row, source) in rotaryRowOrder(rows: rows, heads: heads).enumerated() {
            (result.storage.pointer + row * rowLength).initialize(from: tensor.storage.pointer + source * rowLength, count: rowLength)
        }
        return result
    }
}
