import Foundation
import Testing
import VLMImages
import VLMModels
import VLMPipelines
import VLMTensor

/// What `vlm match` gives for a dual encoder's fixture: every photo against every label put into the template, the
/// texts whose `logits_per_image` the oracle wrote.
enum TemplatedSimilarities {
    /// Expects the pipeline's logits within 1e-4 of `logitsPerImage` (`[photos, labels]`), and every pair's logit to
    /// be its cosine scaled by exp(logit scale) plus the bias that `scaleAndBias` reads from the model.
    static func expect(_ pipeline: DualEncoderPipeline, photos: [RGBImage], labels: [String], template: String,
                       logitsPerImage: Tensor,
                       scaleAndBias: (any ImageTextDualEncoder) throws -> (scale: Float, bias: Float)) throws {
        let prompts = labels.map { template.replacingOccurrences(of: "{}", with: $0) }
        let pairs = try pipeline.similarities(photos, texts: prompts)
        #expect(pairs.allSatisfy { $0.map(\.text) == prompts })
        let logits = pairs.flatMap { $0.map(\.logit) }
        #expect(logitsPerImage.shape == [photos.count, prompts.count])
        #expect(zip(logits, logitsPerImage.scalars).allSatisfy { abs($0 - $1) < 1e-4 })
        let (scale, bias) = try scaleAndBias(pipeline.model)
        for pair in pairs.joined() { #expect(abs(pair.logit - (exp(scale) * pair.cosine + bias)) < 1e-4) }
    }
}
