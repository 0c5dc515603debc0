import Foundation
import VLMCheckpoint
import VLMTensor

// Llama-family decoders from llama.cpp GGUF files: the config from `llama.*`, `qwen2.*`, `qwen3.*` or `smollm3.*`
// metadata, tensors renamed to Hugging Face's names, as transformers' GGUF loader (modeling_gguf_pytorch_utils.py,
// integrations/ggml.py) does; SmolLM3, which transformers does not read from GGUF, as llama.cpp reads it.

extension LlamaConfig {
    /// The `general.architecture`s ``init(gguf:)`` reads; each is also the `model_type` it gives the config.
    static let ggufArchitectures = ["llama", "qwen2", "qwen3", "smollm3"]

    /// The config transformers builds from a GGUF file's `llama.*` or `qwen2.*` metadata (integrations/ggml.py): the
    /// architecture is the model type, with that config class's defaults where a key is missing; tied embeddings when
    /// the file has no `output.weight`; the vocabulary from `<arch>.vocab_size` or the tokenizer's token list.
    /// Qwen2's head width is always `embedding_length / head_count` (transformers ignores `rope.dimension_count`
    /// there) and it has q/k/v biases; Llama from GGUF has no biases, since no metadata turns them on. Qwen3's head
    /// width is `attention.key_length`, as llama.cpp reads it, else Qwen3Config's 128 (transformers always takes
    /// 128, the width of every published Qwen3: its GGUF table maps no key to `head_dim`); no biases. SmolLM3 is
    /// llama's layout (`rope.dimension_count`, Q/K rows interleaved) with every fourth layer unrotated, as llama.cpp
    /// fixes it whatever the checkpoint's `no_rope_layers` were, and SmolLM3Config's token ids where none are given.
    public init(gguf file: GGUFFile) throws {
        let path = file.url.path
        func invalid(_ reason: String) -> CheckpointError { .invalidGGUF(file: path, tensor: nil, reason: reason) }
        guard let architecture = file.metadata["general.architecture"]?.string else {
            throw invalid("general.architecture is missing")
        }
        guard Self.ggufArchitectures.contains(architecture) else {
            // gguf-py has no "mistral" architecture, so transformers 5.23 refuses such files; llama.cpp's converter
            // writes Mistral models as "llama".
            let note = architecture == "mistral" ? ", which llama.cpp does not write (it converts Mistral as llama) and transformers cannot load" : ""
            throw invalid("general.architecture is \"\(architecture)\"\(note); supported: \(ModelRegistry.ggufLanguageModelArchitectures.joined(separator: ", "))")
        }
        let qwen2 = architecture == "qwen2", qwen = qwen2 || architecture == "qwen3", smolLM3 = architecture == "smollm3"
        modelType = architecture
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
        guard numHiddenLayers <= Self.maximumLayerCount else {
            throw invalid("\(architecture).block_count is \(numHiddenLayers), more than the \(Self.maximumLayerCount) any decoder here is built with")
        }
        numAttentionHeads = try requiredInteger("attention.head_count")
        numKeyValueHeads = try integer("attention.head_count_kv") ?? numAttentionHeads
        intermediateSize = try requiredInteger("feed_forward_length")
        maxPositionEmbeddings = try integer("context_length") ?? (qwen || smolLM3 ? 32768 : 2048)
        let evenSplit = numAttentionHeads > 0 ? hiddenSize / numAttentionHeads : 0
        headDim = switch architecture {
        case "qwen2": evenSplit
        case "qwen3": try integer("attention.key_length") ?? 128
        default: try integer("rope.dimension_count") ?? evenSplit
        }
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
        attentionBias = qwen2
        mlpBias = false
        // Qwen2Config and Qwen3Config have no default bos/eos ids; LlamaConfig's are 1 and 2.
        bosTokenId = file.metadata["tokenizer.ggml.bos_token_id"]?.integer ?? (qwen ? nil : smolLM3 ? 128000 : 1)
        eosTokenIds = file.metadata["tokenizer.ggml.eos_token_id"]?.integer.map { [$0] } ?? (qwen ? [] : smolLM3 ? [128001] : [2])
        if smolLM3 { ropeLayers = (0..<numHiddenLayers).map { ($0 + 1) % 4 != 0 } }
    }
}

extension LlamaForCausalLM {
    /// Loads a llama.cpp GGUF file whose `general.architecture` is `llama`, `qwen2`, `qwen3` or `smollm3`: config from
    /// its metadata, and, for llama and smollm3, the query and key rows put back in Hugging Face's order (llama.cpp's converter
    /// interleaves each head's rotary halves there; this undoes it as transformers' `LlamaTensorProcessor` does; qwen files keep
    /// Hugging Face's order). Quantized matrices stay quantized and are read from the mapped file (the query and key
    /// rows are reordered in a quantized copy); norms, biases and float matrices are fp32. As in transformers, a
    /// llama file's bias tensors are not used, and a q/k/v bias a qwen2 file lacks is zero.
    public convenience init(gguf url: URL) throws {
        try self.init(gguf: GGUFFile(url: url))
    }

    /// ``init(gguf:)-(URL)`` from a GGUF file already opened (its tokenizer may come from the same metadata).
    public convenience init(gguf file: GGUFFile) throws {
        let url = file.url
        let config = try LlamaConfig(gguf: file)
        let permuted = config.modelType == "llama" || config.modelType == "smollm3", qwen2 = config.modelType == "qwen2"
        func heads(_ ggufName: String) -> Int? {
            guard permuted else { return nil }
            if ggufName.contains(".attn_q.") { return config.numAttentionHeads }
            if ggufName.contains(".attn_k.") { return config.numKeyValueHeads }
            return nil
        }
        try self.init(config: config, file: url.path, tensor: { name, shape in
            let ggufName = try Self.ggufName(for: name, file: url.path)
            if qwen2, name.hasSuffix(".bias"), file.info(ggufName) == nil { return Tensor(zeros: shape) }
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
                       "mlp.down_proj": "ffn_down", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm"]
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
