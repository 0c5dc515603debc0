import Foundation
import Testing
import VLMCheckpoint

/// `vlm detect` on oracle/owlvit.py's tiny-patch16-fp16 checkpoint and the portrait photo (EXIF orientation 6).
@Suite struct DetectCLITests {
    struct Expected: Decodable {
        struct Box: Decodable, Equatable { let xmin: Int, ymin: Int, xmax: Int, ymax: Int }
        struct Result: Decodable { let label: String, score: Double, box: Box }
        struct Photo: Decodable { let file: String, width: Int, height: Int, low: [Result], `default`: [Result] }
        let labels: [String]
        let photos: [String: Photo]
        let low_threshold: Double
    }

    let model = CLI.fixtures.appendingPathComponent("owlvit/tiny-patch16-fp16")
    let expected: Expected
    let photo: Expected.Photo

    init() throws {
        expected = try JSONDecoder().decode(Expected.self, from: Data(contentsOf: model.appendingPathComponent("expected.json")))
        photo = try #require(expected.photos["portrait"])
    }

    var photoPath: String { CLI.fixtures.appendingPathComponent(photo.file).path }

    /// Width, height, bit depth and colour type from a PNG file's IHDR chunk.
    func pngHeader(_ path: String) throws -> (width: Int, height: Int, depth: Int, color: Int) {
        let bytes = [UInt8](try Data(contentsOf: URL(fileURLWithPath: path)))
        #expect(Array(bytes[0..<8]) == [0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A])
        let word = { (at: Int) in bytes[at..<(at + 4)].reduce(0) { $0 << 8 | Int($1) } }
        return (word(16), word(20), Int(bytes[24]), Int(bytes[25]))
    }

    /// Checks JSON results against the pipeline's: labels, integer boxes and scores within 1e-4, in order. (This
    /// photo's boxes have no corner within float rounding of an integer; the pipeline tests allow for those.)
    func expectPipeline(_ results: [[String: Any]], _ want: [Expected.Result]) throws {
        #expect(results.count == want.count)
        for (result, theirs) in zip(results, want) {
            #expect(result["label"] as? String == theirs.label)
            #expect(abs((result["score"] as? Double ?? -1) - theirs.score) < 1e-4)
            let box = try #require(result["box"] as? [String: Int])
            #expect(Expected.Box(xmin: box["xmin"] ?? -1, ymin: box["ymin"] ?? -1, xmax: box["xmax"] ?? -1,
                                 ymax: box["ymax"] ?? -1) == theirs.box)
        }
    }

    @Test func printsThePipelinesResultsAndDrawsThem() throws {
        let out = FileManager.default.temporaryDirectory.appendingPathComponent("detect-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: out, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: out) }
        let picture = out.appendingPathComponent("boxes.png").path
        let arguments = ["detect", photoPath, "--model", model.path, "--labels", expected.labels.joined(separator: ","),
                         "--out", picture]
        let run = try CLI.run(arguments + ["--json", "--threshold", "\(expected.low_threshold)"])
        #expect(run.status == 0, "\(run.stderr)")
        try expectPipeline(try #require(try CLI.json(run) as? [[String: Any]]), photo.low)
        let header = try pngHeader(picture)
        #expect(header.width == photo.width && header.height == photo.height && header.depth == 8 && header.color == 2)

        let again = try CLI.run(arguments)
        #expect(again.status == 1)
        #expect(again.stderr.split(separator: "\n").count == 1 && again.stderr.contains("exists; pass --force"), "\(again.stderr)")

        let standard = try CLI.run(arguments + ["--force", "--json"])
        #expect(standard.status == 0, "\(standard.stderr)")
        try expectPipeline(try #require(try CLI.json(standard) as? [[String: Any]]), photo.default)

        let table = try CLI.run(["detect", photoPath, "--model", model.path, "--labels", "cat"])
        #expect(table.status == 0, "\(table.stderr)")
        let lines = table.stdout.split(separator: "\n")
        #expect(lines.first == "score   label  box (xmin, ymin, xmax, ymax)")
        let cats = photo.default.filter { $0.label == "cat" }
        #expect(lines.count == 1 + max(cats.count, 1))
        if let best = cats.first {
            #expect(lines[1] == "\(String(format: "%.4f", best.score))  cat  (\(best.box.xmin), \(best.box.ymin), \(best.box.xmax), \(best.box.ymax))")
        }
    }

    /// OWLv2: the photo padded to a square, its boxes scaled by the longer side.
    @Test func owlv2GivesThePipelinesResults() throws {
        let v2 = CLI.fixtures.appendingPathComponent("owlvit/v2-patch32-bf16")
        let want = try JSONDecoder().decode(Expected.self, from: Data(contentsOf: v2.appendingPathComponent("expected.json")))
        let run = try CLI.run(["detect", photoPath, "--model", v2.path, "--labels", want.labels.joined(separator: ","), "--json"])
        #expect(run.status == 0, "\(run.stderr)")
        try expectPipeline(try #require(try CLI.json(run) as? [[String: Any]]), try #require(want.photos["portrait"]).default)
    }

    @Test func queryImageFindsBoxesNamedByItsFile() throws {
        let query = CLI.fixtures.appendingPathComponent(try #require(expected.photos["small"]).file).path
        let run = try CLI.run(["detect", CLI.fixtures.appendingPathComponent(try #require(expected.photos["landscape"]).file).path,
                               "--model", model.path, "--query-image", query, "--json"])
        #expect(run.status == 0, "\(run.stderr)")
        let results = try #require(try CLI.json(run) as? [[String: Any]])
        #expect(!results.isEmpty)
        #expect(results.allSatisfy { $0["label"] as? String == "rocket-small" })
        #expect(abs((results.first?["score"] as? Double ?? 0) - 1) < 1e-5, "the best box's display alpha is 1")
    }

    @Test func badInputIsOneLine() throws {
        let clipseg = CLI.fixtures.appendingPathComponent("clipseg/tiny-fp16").path
        for (arguments, needle) in [
            (["--labels", "cat,,dog"], "label 2 is empty"),
            (["--labels", ""], "no candidate labels"),
            (["--labels", "a photo of a very small cat sitting on a big red sofa in the sun"], "more than the 16 the text model takes"),
            (["--labels", "cat", "--query-image", photoPath], "not both"),
        ] {
            try expectOneLine(["detect", photoPath, "--model", model.path] + arguments, mentioning: needle)
        }
        try expectOneLine(["detect", photoPath, "--model", clipseg, "--labels", "cat"], mentioning: "cannot run `vlm detect`")
    }

    func expectOneLine(_ arguments: [String], mentioning needle: String) throws {
        let run = try CLI.run(arguments)
        #expect(run.status == 1, "\(arguments)")
        #expect(run.stdout.isEmpty)
        #expect(run.stderr.split(separator: "\n").count == 1, "\(run.stderr)")
        #expect(run.stderr.contains(needle), "\(run.stderr)")
    }
}
