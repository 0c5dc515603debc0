import Foundation
import Testing
import VLMCheckpoint

/// `vlm segment` with oracle/groupvit.py's checkpoints: the same files and JSON as for CLIPSeg, GroupViT's numbers.
@Suite struct GroupViTSegmentCLITests {
    struct Expected: Decodable {
        struct Photo: Decodable { let file: String, width: Int, height: Int, coverage: [Double], ambiguous_pixels: [Int] }
        let labels: [String]
        let photos: [String: Photo]
    }

    /// CLIPSeg's CLI suite, for its file readers and one-line error check.
    let helpers: SegmentCLITests

    init() throws { helpers = try SegmentCLITests() }

    func expected(_ checkpoint: String) throws -> (model: URL, expected: Expected) {
        let model = CLI.fixtures.appendingPathComponent("groupvit/\(checkpoint)")
        return (model, try JSONDecoder().decode(Expected.self, from: Data(contentsOf: model.appendingPathComponent("expected.json"))))
    }

    /// The portrait turned upright by its EXIF orientation: logits at the pixel values' resolution, a grey mask and
    /// an RGB overlay at the photo's size, coverage as the oracle counted it.
    @Test(arguments: ["tiny-fp16", "tiny-legacy-bf16"])
    func writesGroupViTsLogitsMasksAndOverlay(_ checkpoint: String) throws {
        let (model, expected) = try expected(checkpoint)
        let photo = try #require(expected.photos["portrait"])
        let out = try helpers.temporaryDirectory()
        defer { try? FileManager.default.removeItem(at: out) }
        let run = try CLI.run(["segment", CLI.fixtures.appendingPathComponent(photo.file).path, "--model", model.path,
                               "--labels", expected.labels.joined(separator: ","), "--out", out.path, "--json"])
        #expect(run.status == 0, "\(run.stderr)")
        let results = try #require(try CLI.json(run) as? [[String: Any]])
        #expect(results.map { $0["label"] as? String } == expected.labels)
        let logits = try SafetensorsFile(url: model.appendingPathComponent("expected.safetensors")).tensor("portrait.segmentation_logits")
        let (side, plane) = (logits.shape[3], logits.shape[2] * logits.shape[3])
        for (index, result) in results.enumerated() {
            let coverage = try #require(result["coverage"] as? Double)
            #expect(abs(coverage - photo.coverage[index]) * Double(photo.width * photo.height)
                    <= Double(photo.ambiguous_pixels[index]) + 0.5, "\(checkpoint) \(expected.labels[index])")
            let npy = try #require(result["logits"] as? String)
            let values = try helpers.npyValues(npy, shape: [side, side])
            let want = logits.scalars[(index * plane)..<((index + 1) * plane)]
            #expect(zip(values, want).allSatisfy { abs($0 - $1) <= 1e-4 * max(1, abs($1)) })
            let mask = try helpers.pngHeader(try #require(result["mask"] as? String))
            #expect(mask.width == photo.width && mask.height == photo.height && mask.depth == 8 && mask.color == 0)
        }
        let overlay = try helpers.pngHeader(out.appendingPathComponent("overlay.png").path)
        // The 180-pixel-wide portrait cannot hold the four-label legend: it goes in a strip below.
        #expect(overlay.width == photo.width && overlay.height > photo.height && overlay.color == 2)
    }

    @Test func exampleImagesAreRefusedInOneLine() throws {
        let (model, expected) = try expected("tiny-fp16")
        let photo = CLI.fixtures.appendingPathComponent(try #require(expected.photos["small"]).file).path
        try helpers.expectOneLine(["segment", photo, "--model", model.path, "--labels", "cat",
                                   "--prompt-image", CLI.fixtures.appendingPathComponent("photos/camera.png").path],
                                  mentioning: "GroupViT segments by text labels only")
        let long = String(repeating: "a very long label ", count: 20)
        try helpers.expectOneLine(["segment", photo, "--model", model.path, "--labels", "cat,\(long)"],
                                  mentioning: "more than the 77 the text model takes")
    }
}
