import Foundation
import Testing

/// `vlm bench` on the zero-shot vision models, on their tiny fixture checkpoints: segmentation and detection time one
/// photo with all its labels; ViLT and SigLIP keep their reports.
@Suite struct BenchZeroShotVisionTests {
    func bench(_ model: String, _ extra: [String] = []) throws -> [String: Any] {
        let path = CLI.fixtures.appendingPathComponent(model).path
        let run = try CLI.run(["bench", "--model", path, "--runs", "1", "--json"] + extra)
        #expect(run.status == 0, "\(run.stderr)")
        return try #require(try CLI.json(run) as? [String: Any])
    }

    @Test(arguments: ["clipseg/tiny-fp16", "clipseg/tiny-refined-bf16", "groupvit/tiny-fp16"])
    func segmentationReportsMillisecondsPerImageWithItsLabels(model: String) throws {
        let report = try bench(model, ["--labels", "4"])
        #expect(report["task"] as? String == "zero-shot-image-segmentation")
        #expect(report["labels"] as? Int == 4)
        #expect((report["ms_per_item"] as? Double ?? 0) > 0)
    }

    @Test(arguments: ["owlvit/tiny-patch32-bf16", "owlvit/v2-patch16-fp16"])
    func detectionReportsMillisecondsPerImageWithThreeLabelsByDefault(model: String) throws {
        let report = try bench(model)
        #expect(report["task"] as? String == "zero-shot-object-detection")
        #expect(report["labels"] as? Int == 3)
        #expect((report["ms_per_item"] as? Double ?? 0) > 0)
    }

    @Test func questionAnsweringAndDualEncoderReportsStay() throws {
        let vilt = try bench("vilt/b32-noqkvbias")
        #expect(vilt["task"] as? String == "visual-question-answering")
        #expect((vilt["ms_per_item"] as? Double ?? 0) > 0)
        let siglip = try bench("siglip/tiny-gelu-bf16")
        #expect(siglip["task"] as? String == "image-embedding" && siglip["batch_size"] as? Int == 1)
        #expect((siglip["ms_per_item"] as? Double ?? 0) > 0)
    }

    @Test func nonPositiveLabelCountIsRefused() throws {
        let run = try CLI.run(["bench", "--model", CLI.fixtures.appendingPathComponent("clipseg/tiny-fp16").path, "--labels", "0"])
        #expect(run.status != 0)
        #expect(run.stderr.contains("--labels"))
    }
}
