import Foundation
import Testing
import VLMCheckpoint

/// `vlm classify` and `vlm embed` on a SigLIP checkpoint (oracle/siglip.py), against transformers.
@Suite struct SiglipCLITests {
    struct Expected: Decodable {
        struct Classified: Decodable { let image: String; let scores: [Score] }
        struct Score: Decodable { let label: String; let score: Double }
        let texts: [String]
        let labels: [String]
        let too_long_label: String
        let zero_shot: [Classified]
    }

    let model = CLI.fixtures.appendingPathComponent("siglip/tiny-tanh-fp16")
    let expected: Expected

    init() throws {
        expected = try JSONDecoder().decode(Expected.self, from: Data(contentsOf: model.appendingPathComponent("expected.json")))
    }

    func photo(_ name: String) -> String { CLI.fixtures.appendingPathComponent("photos/\(name)").path }

    @Test func classifyPrintsThePipelinesSigmoidScores() throws {
        let images = [photo("coffee.png"), photo("camera.png")]
        let run = try CLI.run(["classify"] + images + ["--model", model.path, "--labels", expected.labels.joined(separator: ","), "--json"])
        #expect(run.status == 0, "\(run.stderr)")
        let results = try #require(try CLI.json(run) as? [[String: Any]])
        #expect(results.count == 2)
        for (result, image) in zip(results, images) {
            let want = try #require(expected.zero_shot.first { image.hasSuffix($0.image) })
            let scores = try #require(result["scores"] as? [[String: Any]])
            #expect(scores.map { $0["label"] as? String } == want.scores.map(\.label))
            for (got, score) in zip(scores, want.scores) {
                #expect(abs((got["score"] as? Double ?? -1) - score.score) < 1e-4)
            }
        }
    }

    func expectRows(_ arguments: [String], equal name: String, rows indices: [Int]) throws {
        let run = try CLI.run(["embed", "--model", model.path, "--json"] + arguments)
        #expect(run.status == 0, "\(run.stderr)")
        let rows = try #require((try CLI.json(run) as? [String: Any])?["embeddings"] as? [[Double]])
        let expectedRows = try SafetensorsFile(url: model.appendingPathComponent("expected.safetensors")).tensor(name)
        let width = expectedRows.shape[1]
        #expect(rows.count == indices.count)
        for (row, index) in zip(rows, indices) {
            let want = expectedRows.scalars[(index * width)..<((index + 1) * width)]
            #expect(row.count == width && zip(row, want).allSatisfy { abs($0 - Double($1)) < 1e-4 })
        }
    }

    @Test func embedLikeGetTextAndImageFeatures() throws {
        try expectRows(["--text"] + expected.texts, equal: "text_embeds", rows: Array(expected.texts.indices))
        // rocket.jpg is photo 2 of the oracle's batch.
        try expectRows(["--image", photo("rocket.jpg")], equal: "image_embeds", rows: [2])
    }

    @Test func aLabelTooLongForTheTextTowerIsOneLine() throws {
        let bad = CLIBadInputTests()
        try bad.expectOneLineError(["classify", photo("chelsea.png"), "--model", model.path, "--labels", "cat,\(expected.too_long_label)"],
                                   mentioning: "more than the 64 the text model takes")
        try bad.expectOneLineError(["embed", "--model", model.path, "--text", "This is a photo of \(expected.too_long_label)."],
                                   mentioning: "more than the 64 the text model takes")
    }

    @Test func otherCommandsAndFamiliesAreRefusedAsBefore() throws {
        let bad = CLIBadInputTests()
        try bad.expectOneLineError(["generate", "--model", model.path, "--prompt", "a"],
                                   mentioning: "SigLIP checkpoint (model_type \"siglip\") cannot run `vlm generate`; it runs with vlm classify, vlm embed, vlm match")
        let blip = CLI.fixtures.appendingPathComponent("image-to-text/blip-captioning").path
        try bad.expectOneLineError(["classify", photo("chelsea.png"), "--model", blip, "--labels", "a,b"],
                                   mentioning: "cannot run `vlm classify`; it runs with vlm caption")
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("vlm-siglip-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        try Data(#"{"model_type": "siglip3"}"#.utf8).write(to: directory.appendingPathComponent("config.json"))
        try bad.expectOneLineError(["classify", photo("chelsea.png"), "--model", directory.path, "--labels", "a,b"],
                                   mentioning: "model_type \"siglip3\" is not supported here (supported: clip, clipseg, siglip, siglip2)")
    }
}
