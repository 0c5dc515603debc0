import Foundation
import Testing
import VLMCheckpoint

/// `vlm segment` on oracle/clipseg.py's tiny-fp16 checkpoint and the small photo.
@Suite struct SegmentCLITests {
    struct Expected: Decodable {
        struct Photo: Decodable { let file: String, width: Int, height: Int, coverage: [Double], ambiguous_pixels: [Int] }
        let labels: [String]
        let photos: [String: Photo]
    }

    let model = CLI.fixtures.appendingPathComponent("clipseg/tiny-fp16")
    let expected: Expected
    let photo: Expected.Photo

    init() throws {
        expected = try JSONDecoder().decode(Expected.self, from: Data(contentsOf: model.appendingPathComponent("expected.json")))
        photo = try #require(expected.photos["small"])
    }

    var photoPath: String { CLI.fixtures.appendingPathComponent(photo.file).path }

    func temporaryDirectory() throws -> URL {
        let url = FileManager.default.temporaryDirectory.appendingPathComponent("segment-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
        return url
    }

    /// The float32 values of a NumPy .npy v1 file, checking its header says float32, C order and `shape`.
    func npyValues(_ path: String, shape: [Int]) throws -> [Float] {
        let bytes = [UInt8](try Data(contentsOf: URL(fileURLWithPath: path)))
        #expect(Array(bytes[0..<8]) == [0x93] + Array("NUMPY".utf8) + [1, 0])
        let headerLength = Int(bytes[8]) | Int(bytes[9]) << 8
        let header = String(decoding: bytes[10..<(10 + headerLength)], as: UTF8.self)
        #expect(header.hasPrefix("{'descr': '<f4', 'fortran_order': False, 'shape': (\(shape.map(String.init).joined(separator: ", "))), }"))
        #expect((10 + headerLength) % 64 == 0)
        let data = bytes[(10 + headerLength)...]
        #expect(data.count == shape.reduce(1, *) * 4)
        return stride(from: data.startIndex, to: data.endIndex, by: 4).map { at in
            Float(bitPattern: UInt32(data[at]) | UInt32(data[at + 1]) << 8 | UInt32(data[at + 2]) << 16 | UInt32(data[at + 3]) << 24)
        }
    }

    /// Width, height, bit depth and colour type from a PNG file's IHDR chunk.
    func pngHeader(_ path: String) throws -> (width: Int, height: Int, depth: Int, color: Int) {
        let bytes = [UInt8](try Data(contentsOf: URL(fileURLWithPath: path)))
        #expect(Array(bytes[0..<8]) == [0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A])
        #expect(Array(bytes[12..<16]) == Array("IHDR".utf8))
        let word = { (at: Int) in bytes[at..<(at + 4)].reduce(0) { $0 << 8 | Int($1) } }
        return (word(16), word(20), Int(bytes[24]), Int(bytes[25]))
    }

    @Test func writesLogitsMasksAndOverlayAndRefusesToOverwrite() throws {
        let out = try temporaryDirectory()
        defer { try? FileManager.default.removeItem(at: out) }
        let directory = out.appendingPathComponent("masks").path
        let arguments = ["segment", photoPath, "--model", model.path, "--labels", expected.labels.joined(separator: ","),
                         "--out", directory]
        let run = try CLI.run(arguments + ["--json"])
        #expect(run.status == 0, "\(run.stderr)")
        let results = try #require(try CLI.json(run) as? [[String: Any]])
        #expect(results.map { $0["label"] as? String } == expected.labels)
        let tensors = try SafetensorsFile(url: model.appendingPathComponent("expected.safetensors"))
        let logits = try tensors.tensor("small.logits")
        let (side, plane) = (logits.shape[1], logits.shape[1] * logits.shape[2])
        for (index, result) in results.enumerated() {
            let label = expected.labels[index]
            let name = label.replacingOccurrences(of: "🚀", with: "_")  // no letter, digit or space: not in a file name
            #expect(result["logits"] as? String == "\(directory)/\(name).npy")
            #expect(result["mask"] as? String == "\(directory)/\(name).png")
            let values = try npyValues(try #require(result["logits"] as? String), shape: [side, side])
            let want = Array(logits.scalars[(index * plane)..<((index + 1) * plane)])
            #expect(zip(values, want).allSatisfy { abs($0 - $1) <= 1e-4 * max(1, abs($1)) }, "\(label) logits")
            let mask = try pngHeader(try #require(result["mask"] as? String))
            #expect(mask.width == photo.width && mask.height == photo.height && mask.depth == 8 && mask.color == 0,
                    "\(label) mask: grey, the photo's size")
            let coverage = try #require(result["coverage"] as? Double)
            #expect(abs(coverage - photo.coverage[index]) * Double(photo.width * photo.height) <= Double(photo.ambiguous_pixels[index]) + 0.5)
        }
        // A 40x27 photo is too small to hold the legend: it goes in a strip below, the overlay at least as wide.
        let overlay = try pngHeader("\(directory)/overlay.png")
        #expect(overlay.width >= photo.width && overlay.height > photo.height && overlay.depth == 8 && overlay.color == 2)

        let again = try CLI.run(arguments)
        #expect(again.status != 0)
        #expect(again.stdout.isEmpty)
        #expect(again.stderr.split(separator: "\n").count == 1, "\(again.stderr)")
        #expect(again.stderr.contains("exists; pass --force to overwrite it"), "\(again.stderr)")

        let forced = try CLI.run(arguments + ["--force"])
        #expect(forced.status == 0, "\(forced.stderr)")
        let lines = forced.stdout.split(separator: "\n")
        #expect(lines.first == "coverage  label")
        #expect(lines.count == expected.labels.count + 2)
        #expect(lines.last == "overlay: \(directory)/overlay.png")
    }

    /// Without --out only the coverage is reported; labels that clash as file names still get their own files.
    @Test func reportsCoverageAndNamesFilesApart() throws {
        let run = try CLI.run(["segment", photoPath, "--model", model.path, "--labels", "cat", "--json"])
        #expect(run.status == 0, "\(run.stderr)")
        let results = try #require(try CLI.json(run) as? [[String: Any]])
        #expect(results.count == 1 && results[0]["logits"] == nil && results[0]["mask"] == nil)
        #expect(abs((results[0]["coverage"] as? Double ?? -1) - photo.coverage[0]) * Double(photo.width * photo.height)
                <= Double(photo.ambiguous_pixels[0]) + 0.5)

        let out = try temporaryDirectory()
        defer { try? FileManager.default.removeItem(at: out) }
        let named = try CLI.run(["segment", photoPath, "--model", model.path, "--labels", "a/b,a_b,overlay,.hidden",
                                 "--out", out.path, "--json"])
        #expect(named.status == 0, "\(named.stderr)")
        let files = try #require(try CLI.json(named) as? [[String: Any]]).compactMap { $0["mask"] as? String }
        #expect(files == ["a_b", "a_b-2", "overlay-2", "_hidden"].map { "\(out.path)/\($0).png" })
        #expect(FileManager.default.fileExists(atPath: out.appendingPathComponent("overlay.png").path))
    }

    /// An example image as a prompt, after the text labels, named by its file; its logits are transformers'.
    @Test func imagePromptsAreNamedByTheirFile() throws {
        let out = try temporaryDirectory()
        defer { try? FileManager.default.removeItem(at: out) }
        let landscape = try #require(expected.photos["landscape"])
        let run = try CLI.run(["segment", CLI.fixtures.appendingPathComponent(landscape.file).path, "--model", model.path,
                               "--labels", "a cup of coffee", "--prompt-image", CLI.fixtures.appendingPathComponent("photos/camera.png").path,
                               "--out", out.path, "--json"])
        #expect(run.status == 0, "\(run.stderr)")
        let results = try #require(try CLI.json(run) as? [[String: Any]])
        #expect(results.map { $0["label"] as? String } == ["a cup of coffee", "camera"])
        let want = try SafetensorsFile(url: model.appendingPathComponent("expected.safetensors")).tensor("prompt.logits")
        let values = try npyValues(out.appendingPathComponent("camera.npy").path, shape: Array(want.shape.dropFirst()))
        #expect(zip(values, want.scalars).allSatisfy { abs($0 - $1) <= 1e-4 * max(1, abs($1)) })
    }

    @Test func badInputIsOneLine() throws {
        let clip = CLI.fixtures.appendingPathComponent("clip/tiny-quickgelu-argmax").path
        let out = try temporaryDirectory()
        defer { try? FileManager.default.removeItem(at: out) }
        // A PNG whose header claims 20000x20000 pixels: refused before any pixel is read.
        var ihdr = Array("IHDR".utf8) + [0, 0, 0x4E, 0x20, 0, 0, 0x4E, 0x20, 8, 2, 0, 0, 0]
        ihdr += withUnsafeBytes(of: crc32(ihdr).bigEndian, Array.init)
        let huge = out.appendingPathComponent("huge.png")
        try Data([0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A, 0, 0, 0, 13] + ihdr).write(to: huge)
        let long = String(repeating: "a very long label ", count: 20)
        for (arguments, needle) in [
            (["--labels", "cat,,dog"], "label 2 is empty"),
            (["--labels", ""], "no candidate labels"),
            (["--labels", "cat,cat"], "label \"cat\" is given twice"),
            (["--labels", "cat,\(long)"], "more than the 77 the text model takes"),
            (["--labels", "cat", "--out", photoPath], "--out must be a directory"),
        ] {
            try expectOneLine(["segment", photoPath, "--model", model.path] + arguments, mentioning: needle)
        }
        try expectOneLine(["segment", photoPath, "--model", clip, "--labels", "cat"], mentioning: "cannot run `vlm segment`")
        try expectOneLine(["segment", huge.path, "--model", model.path, "--labels", "cat"], mentioning: "20000x20000")
    }

    func expectOneLine(_ arguments: [String], mentioning needle: String) throws {
        let run = try CLI.run(arguments)
        #expect(run.status == 1, "\(arguments)")
        #expect(run.stdout.isEmpty)
        #expect(run.stderr.split(separator: "\n").count == 1, "\(run.stderr)")
        #expect(run.stderr.contains(needle), "\(run.stderr)")
    }

    /// The CRC-32 PNG chunks carry (ISO 3309, reflected, polynomial 0xEDB88320).
    func crc32(_ bytes: [UInt8]) -> UInt32 {
        var crc: UInt32 = 0xFFFF_FFFF
        for byte in bytes {
            crc ^= UInt32(byte)
            for _ in 0..<8 { crc = crc & 1 == 1 ? (crc >> 1) ^ 0xEDB8_8320 : crc >> 1 }
        }
        return ~crc
    }
}
