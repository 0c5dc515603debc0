import Foundation

/// Tests/Fixtures/images, found from this file's path, and its manifest written by oracle/images.py.
enum Fixtures {
    static let directory: URL = {
        var url = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
        while !FileManager.default.fileExists(atPath: url.appendingPathComponent("Package.swift").path) {
            url.deleteLastPathComponent()
        }
        return url.appendingPathComponent("Tests/Fixtures/images")
    }()

    static func url(_ name: String) -> URL { directory.appendingPathComponent(name) }

    static func bytes(_ name: String) throws -> [UInt8] { [UInt8](try Data(contentsOf: url(name))) }

    struct DecodeCase: Decodable, Sendable, CustomStringConvertible {
        let file: String, pillow_mode: String, width: Int, height: Int, sha256: String
        var description: String { "\(file) (\(pillow_mode))" }
    }

    struct ResizeCase: Decodable, Sendable, CustomStringConvertible {
        let source: String, width: Int, height: Int, filter: String, sha256: String
        var description: String { "\(source) → \(width)x\(height) \(filter)" }
    }

    struct CLIPCase: Decodable, Sendable, CustomStringConvertible {
        let config: String, images: [String], shape: [Int], pixel_values: String
        var description: String { "\(config) on \(images)" }
    }

    /// A checkpoint-like directory whose image processor transformers' AutoImageProcessor chose.
    struct ProcessorCase: Decodable, Sendable, CustomStringConvertible {
        let directory: String, `class`: String, images: [String], shape: [Int]
        var description: String { "\(directory) (\(`class`))" }
    }

    struct Manifest: Decodable {
        let decode: [DecodeCase], resize: [ResizeCase], clip: [CLIPCase], processors: [ProcessorCase]
    }

    static let manifest: Manifest = {
        do {
            return try JSONDecoder().decode(Manifest.self, from: Data(contentsOf: url("manifest.json")))
        } catch {
            fatalError("cannot read \(url("manifest.json").path): \(error)")
        }
    }()
}
