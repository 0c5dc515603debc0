import Foundation
import Testing
import VLMImages
import VLMModels
import VLMPipelines
import VLMTensor

/// `model(**processor(images, text), labels=labels).loss` (oracle/image_chat_loss.py) of the LLaVA, LLaVA-NeXT,
/// LLaVA-OneVision and Gemma 3 fixtures: a photo, a question and an answer, only the answer's tokens scored, as LLaVA's
/// projector alignment trains (Gemma 3's image tokens attending to each other, as its processor's token_type_ids make
/// them).
@Suite struct ImageChatLossTests {
    struct Case: Decodable {
        let checkpoint: String
        let image: String
        let text: String
        let input_ids: [Int]
        let labels: [Int]
        let loss: Float
    }
    struct Expected: Decodable { let cases: [Case] }

    static let fixtures = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Fixtures")
    static let checkpoints = ["llava/llama-default-fp16", "llava/qwen2-layers-full-bf16", "llava-next/llama-tied-fp16",
                              "llava-next/mistral-layers-bf16", "llava-onevision/qwen2-layers-fp16",
                              "llava-onevision/qwen2-smollm2-bf16", "gemma3/tiny"]

    @Test(arguments: checkpoints)
    func lossOverTheAnswerMatchesTransformers(_ checkpoint: String) throws {
        let expected = try JSONDecoder().decode(Expected.self, from: Data(contentsOf: Self.fixtures.appendingPathComponent("image-chat-loss.json")))
        let test = try #require(expected.cases.first { $0.checkpoint == checkpoint })
        // transformers computed in fp32, whatever the checkpoint stores.
        let pipeline = try MatrixPrecision.$forNewLayers.withValue(.float32) {
            try ImageToTextPipeline(directory: Self.fixtures.appendingPathComponent(checkpoint))
        }
        let model = try #require(pipeline.model as? any ImageChatModel)
        let processor = try #require(pipeline.processor as? any ImageChatProcessor)
        let photo = try ImageDecoder.decode(contentsOf: Self.fixtures.appendingPathComponent(test.image))
        let images = try processor.preprocess([photo], conversationImageCount: 1)
        let ids = try #require(try processor.promptIds(test.text, for: images)?.first)
        #expect(ids == test.input_ids)
        let loss = try model.loss(images: images, inputIds: ids, labels: test.labels)
        #expect(abs(loss - test.loss) < 1e-4, "\(checkpoint): \(loss) against \(test.loss)")
        #expect(throws: ModelError.self) { try model.loss(images: images, inputIds: ids, labels: Array(test.labels.dropLast())) }
    }
}
