import Foundation

/// A directory laid out like a Hugging Face checkpoint: config.json, weights, tokenizer and processor files.
public struct ModelDirectory: Sendable {
    public let url: URL

    /// Checks that `url` exists, is a directory, and holds config.json.
    public init(url: URL) throws {
        var isDirectory: ObjCBool = false
        guard FileManager.default.fileExists(atPath: url.path, isDirectory: &isDirectory) else {
            throw CheckpointError.missingFile(path: url.path)
        }
        guard isDirectory.boolValue else { throw CheckpointError.notADirectory(path: url.path) }
        self.url = url
        guard fileURL("config.json") != nil else {
            throw CheckpointError.missingFile(path: url.appendingPathComponent("config.json").path)
        }
    }

    /// The URL of the file `name` in the directory, or nil when there is no such regular file.
    public func fileURL(_ name: String) -> URL? {
        let file = url.appendingPathComponent(name)
        var isDirectory: ObjCBool = false
        guard FileManager.default.fileExists(atPath: file.path, isDirectory: &isDirectory), !isDirectory.boolValue else {
            return nil
        }
        return file
    }

    /// Decodes config.json (or another JSON file of the directory) into `type`.
    ///
    /// Decoding errors become one-line ``CheckpointError``s naming the file and the key path, e.g.
    /// `…/config.json: 'vision_config.hidden_size': expected an integer: …`.
    public func decode<T: Decodable>(_ type: T.Type, from file: String = "config.json") throws -> T {
        let path = url.appendingPathComponent(file).path
        return try decodeJSON(
            type, from: readJSONFile(path),
            syntaxError: { CheckpointError.invalidJSON(file: path, reason: $0) },
            contentError: { CheckpointError.invalidConfig(file: path, keyPath: $0, reason: $1) })
    }

    /// The top-level object of a JSON file of the directory, or nil when the file is absent.
    public func jsonObject(_ file: String) throws -> [String: Any]? {
        guard let fileURL = fileURL(file) else { return nil }
        return try readJSONObject(fileURL.path)
    }

    /// config.json's `model_type`, which says which architecture the checkpoint is.
    public var modelType: String {
        get throws {
            let path = url.appendingPathComponent("config.json").path
            guard let object = try jsonObject("config.json") else { throw CheckpointError.missingFile(path: path) }
            guard let modelType = object["model_type"] as? String else {
                throw CheckpointError.invalidConfig(
                    file: path, keyPath: "model_type",
                    reason: object["model_type"] == nil ? "required key is missing" : "expected a string")
            }
            return modelType
        }
    }
}

/// Configs, indexes and processor files are kilobytes; tokenizer.json can reach tens of megabytes.
let maximumJSONFileSize = 256 << 20

/// The bytes of a JSON file, refusing anything too large to be one so a wrong path cannot load gigabytes.
func readJSONFile(_ path: String) throws -> Data {
    let attributes: [FileAttributeKey: Any]
    do {
        // Follow symlinks: Hugging Face cache snapshots link every file into blobs/.
        attributes = try FileManager.default.attributesOfItem(atPath: URL(fileURLWithPath: path).resolvingSymlinksInPath().path)
    } catch {
        throw CheckpointError.missingFile(path: path)
    }
    guard attributes[.type] as? FileAttributeType == .typeRegular else {
        throw CheckpointError.unreadable(file: path, reason: "not a regular file")
    }
    let size = (attributes[.size] as? NSNumber)?.intValue ?? 0
    guard size <= maximumJSONFileSize else {
        throw CheckpointError.fileTooLarge(file: path, size: size, limit: maximumJSONFileSize)
    }
    do {
        return try Data(contentsOf: URL(fileURLWithPath: path))
    } catch {
        throw CheckpointError.unreadable(file: path, reason: error.localizedDescription)
    }
}

/// The top-level object of a JSON file.
func readJSONObject(_ path: String) throws -> [String: Any] {
    let data = try readJSONFile(path)
    let object: Any
    do {
        object = try JSONSerialization.jsonObject(with: data)
    } catch {
        let detail = (error as NSError).userInfo[NSDebugDescriptionErrorKey] as? String ?? "\(error)"
        throw CheckpointError.invalidJSON(file: path, reason: detail)
    }
    guard let dictionary = object as? [String: Any] else {
        throw CheckpointError.invalidJSON(file: path, reason: "the top level is not an object")
    }
    return dictionary
}
