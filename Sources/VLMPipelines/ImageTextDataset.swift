import Foundation
import VLMTemplates

/// Image–text pairs laid out as 🤗 datasets' `imagefolder` with metadata: a directory holding the images and a
/// `metadata.jsonl` (one JSON object per line) or `metadata.csv` (a header row, then one row per image) whose
/// `file_name` column names each image, relative to the directory, and whose text column (`text` unless told)
/// holds its caption. `load_dataset("imagefolder", data_dir=…)` reads the same directory as `image` and `text`.
public struct ImageTextDataset: Sendable {
    public struct Pair: Sendable, Equatable {
        public let image: URL
        public let text: String
    }

    public let pairs: [Pair]

    /// Reads `directory/metadata.jsonl`, else `directory/metadata.csv`. Every row must name an image file that
    /// exists, inside the directory, and hold a string in `textColumn`; the first that does not is the error.
    public init(directory: URL, textColumn: String = "text") throws {
        let metadata = try ImageFolderMetadata(directory: directory)
        pairs = try metadata.rows.map { row in
            guard case let .string(text)? = row.fields[textColumn] else {
                throw DatasetError(file: metadata.file.path, reason: "line \(row.line) has no \(textColumn) (choose the caption column with --text-column)")
            }
            return Pair(image: row.image, text: text)
        }
    }
}

/// The rows of an imagefolder dataset's metadata (metadata.jsonl, else metadata.csv), each with its image resolved
/// inside the dataset's directory.
struct ImageFolderMetadata {
    struct Row {
        let line: Int
        let image: URL
        let fields: [String: JSONValue]
    }

    let file: URL
    let rows: [Row]

    init(directory: URL) throws {
        var isDirectory: ObjCBool = false
        guard FileManager.default.fileExists(atPath: directory.path, isDirectory: &isDirectory) else {
            throw DatasetError(file: directory.path, reason: "no such directory (a dataset is a directory of images and their metadata)")
        }
        guard isDirectory.boolValue else {
            throw DatasetError(file: directory.path, reason: "a file, not a directory of images and their metadata (an imagefolder dataset)")
        }
        let jsonl = directory.appendingPathComponent("metadata.jsonl"), csv = directory.appendingPathComponent("metadata.csv")
        let records: [(line: Int, fields: [String: JSONValue])]
        if FileManager.default.fileExists(atPath: jsonl.path) {
            file = jsonl
            records = try Self.jsonLines(Self.read(jsonl), file: jsonl.path)
        } else if FileManager.default.fileExists(atPath: csv.path) {
            file = csv
            records = try Self.csvRows(Self.read(csv), file: csv.path).map { ($0.line, $0.fields.mapValues(JSONValue.string)) }
        } else {
            throw DatasetError(file: directory.path, reason: "neither metadata.jsonl nor metadata.csv (an imagefolder dataset's metadata)")
        }
        let root = directory.standardizedFileURL.resolvingSymlinksInPath()
        let file = self.file
        rows = try records.map { line, fields in
            guard case let .string(name)? = fields["file_name"] else {
                throw DatasetError(file: file.path, reason: "line \(line) has no file_name")
            }
            let image = root.appendingPathComponent(name).standardizedFileURL.resolvingSymlinksInPath()
            guard image.path.hasPrefix(root.path + "/") else {
                throw DatasetError(file: file.path, reason: "line \(line): \(name) is outside the dataset's directory")
            }
            guard FileManager.default.fileExists(atPath: image.path) else {
                throw DatasetError(file: file.path, reason: "line \(line): no image file \(name)")
            }
            return Row(line: line, image: image, fields: fields)
        }
        guard !rows.isEmpty else { throw DatasetError(file: file.path, reason: "no rows") }
    }

    /// A metadata file's text; metadata beyond 256 MiB is refused rather than read.
    static func read(_ url: URL) throws -> String {
        let size = (try? FileManager.default.attributesOfItem(atPath: url.path)[.size] as? Int) ?? 0
        guard size <= 256 << 20 else { throw DatasetError(file: url.path, reason: "\(size) bytes, more than the 256 MiB a metadata file may have") }
        guard let data = FileManager.default.contents(atPath: url.path) else {
            throw DatasetError(file: url.path, reason: "cannot be read")
        }
        guard let text = String(data: data, encoding: .utf8) else { throw DatasetError(file: url.path, reason: "not UTF-8") }
        return text
    }

    /// Each non-blank line's object, by its members.
    static func jsonLines(_ text: String, file: String) throws -> [(line: Int, fields: [String: JSONValue])] {
        var rows: [(line: Int, fields: [String: JSONValue])] = []
        for (index, line) in text.split(separator: "\n", omittingEmptySubsequences: false).enumerated() {
            guard !line.allSatisfy(\.isWhitespace) else { continue }
            guard case let .object(members)? = try? JSONValue(parsing: Data(line.utf8)) else {
                throw DatasetError(file: file, reason: "line \(index + 1) is not a JSON object")
            }
            rows.append((index + 1, Dictionary(members, uniquingKeysWith: { _, last in last })))
        }
        return rows
    }

    /// RFC 4180 rows (quoted fields may hold commas, doubled quotes and line breaks) keyed by the header row.
    private static func csvRows(_ text: String, file: String) throws -> [(line: Int, fields: [String: String])] {
        var records: [(line: Int, values: [String])] = []
        var values: [String] = [], field = "", quoted = false, atFieldStart = true
        var line = 1, recordLine = 1
        var characters = text.makeIterator()
        var pending = characters.next()
        while let character = pending {
            pending = characters.next()
            if quoted {
                if character == "\"" {
                    if pending == "\"" { field.append("\""); pending = characters.next() } else { quoted = false }
                } else {
                    if character == "\n" || character == "\r\n" { line += 1 }
                    field.append(character)
                }
                continue
            }
            switch character {
            case "\"" where atFieldStart: quoted = true; atFieldStart = false
            case ",": values.append(field); field = ""; atFieldStart = true
            case "\n", "\r\n", "\r":
                values.append(field)
                if values != [""] { records.append((recordLine, values)) }
                values = []; field = ""; atFieldStart = true
                line += 1
                recordLine = line
            default: field.append(character); atFieldStart = false
            }
        }
        if quoted { throw DatasetError(file: file, reason: "line \(recordLine): a quoted field does not end") }
        values.append(field)
        if values != [""] { records.append((recordLine, values)) }
        guard let header = records.first?.values else { return [] }
        return try records.dropFirst().map { record in
            guard record.values.count == header.count else {
                throw DatasetError(file: file, reason: "line \(record.line) has \(record.values.count) fields, the header \(header.count)")
            }
            return (record.line, Dictionary(zip(header, record.values), uniquingKeysWith: { first, _ in first }))
        }
    }
}

/// A dataset directory or metadata file that cannot be read as image–text pairs.
public struct DatasetError: Error, CustomStringConvertible, Sendable {
    public let file: String
    public let reason: String
    public var description: String { "\(file): \(reason)" }
}
