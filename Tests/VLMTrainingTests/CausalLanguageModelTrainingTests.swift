import Foundation
import Testing
import VLMCheckpoint
import VLMModels
import VLMTraining

@Suite struct CausalLanguageModelTrainingTests {
    /// oracle/sft.py's record of transformers and torch fine-tuning a tiny Qwen2 chat model.
    struct Record: Decodable {
        let settings: LlavaTrainingTests.Record.Settings
        let input_ids: [[Int]]
        let attention_mask: [[Int]]
        let labels: [[Int]]
        let losses: [Float]
        let gradient_norms: [Float]
        let final_loss: Float
        let trained: [String]
        let decayed: [String]
    }

    /// Every step's loss and gradient norm, the first step's gradient of every tensor and every tensor after the last
    /// step, against torch's autograd and AdamW as Trainer steps them: a Qwen2 decoder with q/k/v biases and an untied
    /// head, and a Qwen3 decoder (each query and key head normalized, heads wider than hidden_size / heads, a tied
    /// head), on a right-padded batch of two chat-templated conversations whose replies alone are scored, its pad
    /// token `<|im_end|>` inside the replies too (the embedding's `padding_idx`, whose row torch never updates).
    @Test(arguments: ["qwen2-chatml", "qwen3-chatml"])
    func fineTuningMatchesTransformers(_ name: String) throws {
        let fixtures = ContrastiveTrainingFixture.fixtures
        let record = try JSONDecoder().decode(Record.self, from: Data(contentsOf: fixtures.appendingPathComponent("sft/\(name).json")))
        let tensors = try SafetensorsFile(url: fixtures.appendingPathComponent("sft/\(name).safetensors"))
        let training = try CausalLanguageModelTraining(directory: ModelDirectory(url: fixtures.appendingPathComponent("sft/\(name)")))
        #expect(training.parameters.map(\.name).sorted() == record.trained)
        #expect(training.parameters.filter(\.decays).map(\.name).sorted() == record.decayed)
        try expectTrainingAsRecorded(name: name, parameters: training.parameters, settings: record.settings,
                                     losses: record.losses, gradientNorms: record.gradient_norms, tensors: tensors) {
            try training.lossAndGradients(inputIds: record.input_ids, attentionMask: record.attention_mask, labels: record.labels)
        }
        let final = try training.loss(inputIds: record.input_ids, attentionMask: record.attention_mask, labels: record.labels)
        #expect(abs(final - record.final_loss) < 1e-4, "final loss \(final) against \(record.final_loss)")
    }

    /// LoRA as PEFT trains it: from the oracle's `A` draws and zero `B`s beside q_proj, v_proj and down_proj, every
    /// step's loss and norm, the first step's gradients (only `B`'s are non-zero then) and every update after the
    /// last step; the merged weights' loss is the adapter's.
    @Test func loraMatchesPEFT() throws {
        struct LoraRecord: Decodable {
            struct Lora: Decodable { let r: Int; let lora_alpha: Float; let target_modules: [String] }
            let lora: Lora
        }
        let fixtures = ContrastiveTrainingFixture.fixtures
        let data = try Data(contentsOf: fixtures.appendingPathComponent("sft/qwen2-chatml-lora.json"))
        let record = try JSONDecoder().decode(Record.self, from: data)
        let recorded = try JSONDecoder().decode(LoraRecord.self, from: data).lora
        let tensors = try SafetensorsFile(url: fixtures.appendingPathComponent("sft/qwen2-chatml-lora.safetensors"))
        var lora = LoraSettings()
        (lora.rank, lora.alpha, lora.targetModules) = (recorded.r, recorded.lora_alpha, recorded.target_modules)
        let directory = try ModelDirectory(url: fixtures.appendingPathComponent("sft/qwen2-chatml"))
        let training = try CausalLanguageModelTraining(directory: directory, lora: lora)
        #expect(training.parameters.map(\.name).sorted() == record.trained)
        #expect(training.parameters.filter(\.decays).map(\.name).sorted() == record.decayed)
        for parameter in training.parameters {
            let initial = try tensors.tensor("initial.\(parameter.name)")
            if parameter.name.contains("lora_B") { #expect(parameter.value.scalars.allSatisfy { $0 == 0 } && initial.scalars.allSatisfy { $0 == 0 }) }
            let bound = 1 / Float(parameter.value.shape[1]).squareRoot()
            #expect(parameter.value.scalars.allSatisfy { abs($0) <= bound }, "\(parameter.name) drawn outside ±\(bound)")
            parameter.value.storage.pointer.update(from: initial.scalars, count: initial.count)
        }
        try expectTrainingAsRecorded(name: "qwen2-chatml LoRA", parameters: training.parameters, settings: record.settings,
                                     losses: record.losses, gradientNorms: record.gradient_norms, tensors: tensors) {
            try training.lossAndGradients(inputIds: record.input_ids, attentionMask: record.attention_mask, labels: record.labels)
        }
        let final = try training.loss(inputIds: record.input_ids, attentionMask: record.attention_mask, labels: record.labels)
        #expect(abs(final - record.final_loss) < 1e-4, "final loss \(final) against \(record.final_loss)")

        let merged = FileManager.default.temporaryDirectory.appendingPathComponent("lora-merged-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: merged) }
        try training.save(to: merged, mergingLora: true)
        let reloaded = try CausalLanguageModelTraining(directory: ModelDirectory(url: merged))
        let mergedLoss = try reloaded.loss(inputIds: record.input_ids, attentionMask: record.attention_mask, labels: record.labels)
        #expect(abs(mergedLoss - record.final_loss) < 1e-4, "merged checkpoint's loss \(mergedLoss) against \(record.final_loss)")
    }

    /// A Mistral checkpoint with a sliding window trains on batches no longer than the window, where attention is
    /// fully causal (its loss the inference model's, which the decoder fixtures check against transformers with the
    /// window); a longer batch is refused in one line.
    @Test func slidingWindowBoundsTheBatchLength() throws {
        let directory = try ModelDirectory(url: ContrastiveTrainingFixture.fixtures.appendingPathComponent("decoders/mistral-sliding"))
        let training = try CausalLanguageModelTraining(directory: directory)
        let model = try LlamaForCausalLM(directory: directory)
        let window = [[5, 17, 42, 99, 3]], labels = [[5, 17, 42, 99, 3]]
        let loss = try training.lossAndGradients(inputIds: window, attentionMask: nil, labels: labels)
        let expected = try model.loss(inputIds: window, labels: labels)
        #expect(abs(loss - expected) < 1e-5, "loss \(loss) against the inference model's \(expected)")
        let error = try #require(throws: ModelError.self) {
            try training.lossAndGradients(inputIds: [window[0] + [7]], attentionMask: nil, labels: [labels[0] + [7]])
        }
        #expect("\(error)".contains("a batch of 6 tokens is longer than the language model's sliding window of 5"), "\(error)")
    }

    /// SmolLM3's NoPE layer (the fixture's second: no_rope_layer_interval 2) trains without rotating its queries and
    /// keys: the loss is the inference model's (held to transformers by the decoder fixtures), and the gradients of that
    /// layer's query and key weights, the ones the missing rotation acts on, are the loss's central differences.
    @Test func noPELayersTrainUnrotated() throws {
        let directory = try ModelDirectory(url: ContrastiveTrainingFixture.fixtures.appendingPathComponent("decoders/smollm3"))
        let training = try CausalLanguageModelTraining(directory: directory)
        #expect(training.config.ropeLayers == [true, false])
        let ids = [[5, 17, 42, 99]], labels = [[5, 17, 42, 99]]
        let loss = try training.lossAndGradients(inputIds: ids, attentionMask: nil, labels: labels)
        let expected = try LlamaForCausalLM(directory: directory).loss(inputIds: ids, labels: labels)
        #expect(abs(loss - expected) < 1e-5, "loss \(loss) against the inference model's \(expected)")
        for name in ["model.layers.1.self_attn.q_proj.weight", "model.layers.1.self_attn.k_proj.weight"] {
            let parameter = try #require(training.parameters.first { $0.name == name })
            let gradient = try #require(parameter.gradient).scalars
            // The elements with the largest gradients, where a float32 difference quotient is well above its noise.
            for index in gradient.indices.sorted(by: { abs(gradient[$0]) > abs(gradient[$1]) }).prefix(3) {
                let original = parameter.value.storage.pointer[index], step: Float = 1e-2
                parameter.value.storage.pointer[index] = original + step
                let above = try training.loss(inputIds: ids, attentionMask: nil, labels: labels)
                parameter.value.storage.pointer[index] = original - step
                let below = try training.loss(inputIds: ids, attentionMask: nil, labels: labels)
                parameter.value.storage.pointer[index] = original
                let numeric = (above - below) / (2 * step)
                #expect(abs(numeric - gradient[index]) <= 0.02 * abs(gradient[index]) + 1e-4,
                        "\(name)[\(index)]: gradient \(gradient[index]), central difference \(numeric)")
            }
        }
    }

    @Test func otherFamiliesAreRefused() throws {
        let directory = ContrastiveTrainingFixture.fixtures.appendingPathComponent("clip/tiny-quickgelu-argmax")
        let error = try #require(throws: ModelError.self) { try CausalLanguageModelTraining(directory: ModelDirectory(url: directory)) }
        #expect("\(error)".contains("model_type \"clip\" is not supported here (supported: llama, mistral, qwen2, qwen3, smollm3)"), "\(error)")
    }
}
