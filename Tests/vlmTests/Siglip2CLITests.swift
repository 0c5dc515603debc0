import Foundation
import Testing
import VLMCheckpoint

/// `vlm classify` and `vlm embed` on a SigLIP 2 checkpoint (oracle/siglip2.py), against transformers.
@Suite struct Siglip2CLITests {
    struct Expected: Decodable {
        struct Classified: Decodable { let image: String; let scores: [Score] }
        struct Score: Decodable { let label: String; let score: Double }
        let photos: [String]
        let texts: [String]
        let labels: [String]
        let too_long_label: String
        let zero_shot: [Classified]
    }

    /// Stored in bf16, so it runs in bf16 unless asked otherwise; transformers ran it in fp32 (the oracle loads every
    /// checkpoint with dtype=torch.float32), hence `--dtype fp32` wherever the numbers are compared.
    let model = CLI.fixtures.appendingPathComponent("siglip2/tiny-naflex-bf16")
    let expected: Expected

    init() throws {
        expected = try JSONDecoder().decode(Expected.self, from: Data(contentsOf: model.appendingPathComponent("expected.json")))
    }

    func photo(_ index: Int) -> String { CLI.fixtures.appendingPathComponent(expected.photos[index]).path }

    /// The portrait (EXIF orientation 6) and the 5:1 photo, one call.
    @Test func classifyPrintsThePipelinesSigmoidScores() throws {
        let indices = [1, 3]
        let run = try CLI.run(["classify"] + indices.map(photo) + ["--model", model.path, "--labels", expected.labels.joined(separator: ","),
                                                                   "--dtype", "fp32", "--json"])
        #expect(run.status == 0, "\(run.stderr)")
        let results = try #require(try CLI.json(run) as? [[String: Any]])
        #expect(results.count == 2)
        for (result, index) in zip(results, indices) {
            #expect(result["image"] as? String == photo(index))
            let want = expected.zero_shot[index]
            let scores = try #require(result["scores"] as? [[String: Any]])
            #expect(scores.map { $0["label"] as? String } == want.scores.map(\.label))
            for (got, score) in zip(scores, want.scores) {
                #expect(abs((got["score"] as? Double ?? -1) - score.score) < 1e-4)
            }
        }
    }

    func expectRows(_ arguments: [String], equal name: String, rows indices: [Int]) throws {
        let run = try CLI.run(["embed", "--model", model.path, "--dtype", "fp32", "--json"] + arguments)
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
        try expectRows(["--image", photo(2), photo(0)], equal: "image_embeds_alone", rows: [2, 0])
    }

    @Test func aLabelTooLongForTheTextTowerIsOneLine() throws {
        let bad = CLIBadInputTests()
        try bad.expectOneLineError(["classify", photo(0), "--model", model.path, "--labels", "cat,\(expected.too_long_label)"],
                                   mentioning: "more than the 64 the text model takes")
        try bad.expectOneLineError(["embed", "--model", model.path, "--text", "This is a photo of \(expected.too_long_label)."],
                                   mentioning: "more than the 64 the text model takes")
    }

    /// Its input is a 640×480 photo of noise through the NaFlex processor, as no fixed image size exists.
    @Test func benchReportsMillisecondsPerImage() throws {
        let run = try CLI.run(["bench", "--model", model.path, "--batch-size", "2", "--runs", "1", "--json"])
        #expect(run.status == 0, "\(run.stderr)")
        let report = try #require(try CLI.json(run) as? [String: Any])
        #expect(report["task"] as? String == "image-embedding")
        #expect(report["batch_size"] as? Int == 2)
        #expect((report["ms_per_item"] as? Double ?? 0) > 0)
    }

    @Test func otherCommandsAreRefused() throws {
        try CLIBadInputTests().expectOneLineError(["caption", photo(0), "--model", model.path],
                                                  mentioning: "SigLIP 2 checkpoint (model_type \"siglip2\") cannot run `vlm caption`; it runs with vlm classify, vlm embed, vlm match")
    }
}
