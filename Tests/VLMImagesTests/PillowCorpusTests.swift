import Foundation
import Testing
@testable import VLMImages

/// Pillow's own test images (Tests/images of Pillow 13.0.0's source package: the JPEG, PNG, WebP, GIF, BMP and TIFF
/// files, many of them odd or hostile on purpose). They take 23 MB, so they are not committed: `.ci/run` extracts them
/// into models/pillow-images/ and sets `$SWIFTVLM_PILLOW_IMAGES` to that folder, and then every file must be there;
/// without the variable the suite reads models/pillow-images/ under the package root when it exists and is skipped
/// otherwise. What Pillow made of each file is in Tests/Fixtures/pillow-corpus/verdicts.json (oracle/pillow_corpus.py).
enum PillowCorpus {
    static let packageRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent()

    static let required = ProcessInfo.processInfo.environment["SWIFTVLM_PILLOW_IMAGES"].map { !$0.isEmpty } ?? false

    static let directory: URL = {
        if let path = ProcessInfo.processInfo.environment["SWIFTVLM_PILLOW_IMAGES"], !path.isEmpty {
            return URL(fileURLWithPath: path, relativeTo: packageRoot)
        }
        return packageRoot.appendingPathComponent("models/pillow-images")
    }()

    static let available = required || FileManager.default.fileExists(atPath: directory.path)

    static let skipMessage = "Pillow's test images not found: run .ci/run's extraction of Pillow 13.0.0's Tests/images into models/pillow-images/"

    /// Pillow's verdict on one file: the RGB image `load_image` returns (size and SHA-256 of its bytes), or its refusal.
    struct Verdict: Decodable, Sendable {
        let file: String, format: String?, mode: String?
        let width: Int?, height: Int?, sha256: String?, refused: String?
    }

    struct Table: Decodable {
        let pillow: String, files: [Verdict]
    }

    static let table: Table = {
        let url = packageRoot.appendingPathComponent("Tests/Fixtures/pillow-corpus/verdicts.json")
        do {
            return try JSONDecoder().decode(Table.self, from: Data(contentsOf: url))
        } catch {
            fatalError("cannot read \(url.path): \(error)")
        }
    }()
}

@Suite(.enabled(if: PillowCorpus.available, Comment(rawValue: PillowCorpus.skipMessage)))
struct PillowCorpusTests {
    /// Every file decodes to Pillow's pixels or is refused, with one line naming it, where Pillow refuses it.
    @Test func agreesWithPillowOnItsTestImages() throws {
        let verdicts = PillowCorpus.table.files
        #expect(verdicts.count == 704)
        var disagreements: [String] = []
        var agreeing = 0
        for verdict in verdicts {
            let url = PillowCorpus.directory.appendingPathComponent(verdict.file)
            let outcome: String
            do {
                let image = try ImageDecoder.decode(contentsOf: url)
                if let sha256 = verdict.sha256 {
                    outcome = image.width == verdict.width && image.height == verdict.height && sha256Hex(image.pixels) == sha256
                        ? "agree" : "decoded \(image.width)x\(image.height) differently from Pillow's \(verdict.width ?? 0)x\(verdict.height ?? 0) \(verdict.mode ?? "")"
                } else {
                    outcome = "decoded \(image.width)x\(image.height), Pillow refuses: \(verdict.refused ?? "")"
                }
            } catch let error as ImageError {
                let line = error.description
                #expect(!line.contains("\n") && line.hasPrefix(url.path), "\(line)")
                outcome = verdict.refused != nil ? "agree" : "refused (\(line)), Pillow decodes \(verdict.format ?? "") \(verdict.mode ?? "")"
            }
            if outcome == "agree" {
                agreeing += 1
            } else {
                disagreements.append("\(verdict.file): \(outcome)")
            }
        }
        print("Pillow \(PillowCorpus.table.pillow) test images: \(agreeing) of \(verdicts.count) agree")
        for line in disagreements { print("differs: \(line)") }
        #expect(disagreements.count == 0, "files that differ: \(disagreements.prefix(3)) …")
    }
}
