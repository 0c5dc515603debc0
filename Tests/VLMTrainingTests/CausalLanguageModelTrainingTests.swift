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
    /// head, on a right-padded batch of two chat-templated conversations whose replies alone are scored, its pad token
    /// `<|im_end|>` inside the replies too (the embedding's `padding_idx`, whose row torch never updates).
    @Test func fineTuningMatchesTransformers() throws {
        let fixtures = LiTFixture.fixtures
        let record = try JSONDecoder().decode(Record.self, from: Data(contentsOf: fixtures.appendingPathComponent("sft/qwen2-chatml.json")))
        let tensors = try SafetensorsFile(url: fixtures.appendingPathComponent("sft/qwen2-chatml.safetensors"))
        let training = try CausalLanguageModelTraining(directory: ModelDirectory(url: fixtures.appendingPathComponent("sft/qwen2-chatml")))
        #expect(training.parameters.map(\.name).sorted() == record.trained)
        #expect(training.parameters.filter(\.decays).map(\.name).sorted() == record.decayed)
        try expectTrainingAsRecorded(name: "qwen2-chatml", parameters: training.parameters, settings: record.settings,
                                     losses: record.losses, gradientNorms: record.gradient_norms, tensors: tensors) {
            try training.lossAndGradients(inputIds: record.input_ids, attentionMask: record.attention_mask, labels: record.labels)
        }
        let final = try training.loss(inputIds: record.input_ids, attentionMask: record.attention_mask, labels: record.labels)
        #expect(abs(final - record.final_loss) < 1e-4, "final loss \(final) against \(record.final_loss)")
    }

    @Test func otherFamiliesAreRefused() throws {
        let directory = LiTFixture.fixtures.appendingPathComponent("clip/tiny-quickgelu-argmax")
        let error = try #require(throws: ModelError.self) { try CausalLanguageModelTraining(directory: ModelDirectory(url: directory)) }
        #expect("\(error)".contains("model_type \"clip\" is not supported here (supported: llama, mistral, qwen2)"), "\(error)")
    }
}
