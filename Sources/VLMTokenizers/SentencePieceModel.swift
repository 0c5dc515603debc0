import Foundation

/// The parts of a SentencePiece model file (`spiece.model`, sentencepiece_model.proto's `ModelProto`) that a
/// tokenizer pipeline is built from: the pieces with their scores and types, the trainer's model type, unknown id and
/// byte fallback, and the normalizer's precompiled rules and whitespace options.
struct SentencePieceModel {
    struct Piece {
        let piece: String
        let score: Float
        /// 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte.
        let type: Int
    }

    enum ModelType: Int {
        case unigram = 1, bpe, word, character
    }

    var pieces: [Piece] = []
    var modelType = ModelType.unigram
    var unknownId = 0
    var byteFallback = false
    /// Empty when the model has no normalization rules (its normalizer is "identity").
    var precompiledCharsmap: [UInt8] = []
    var addDummyPrefix = true
    var removeExtraWhitespaces = true
    var escapeWhitespaces = true

    let file: String

    init(url: URL) throws {
        file = url.path
        let data: Data
        do {
            data = try Data(contentsOf: url)
        } catch {
            throw TokenizerError.unreadable(file: url.path, reason: "\(error)")
        }
        try read(ProtobufReader([UInt8](data), file: file, path: "ModelProto"))
        guard !pieces.isEmpty else { throw TokenizerError.invalidField(file: file, path: "ModelProto.pieces", reason: "no pieces") }
        guard pieces.indices.contains(unknownId) else {
            throw TokenizerError.invalidField(file: file, path: "ModelProto.trainer_spec.unk_id",
                                              reason: "\(unknownId) is outside the \(pieces.count) pieces")
        }
    }

    private mutating func read(_ model: ProtobufReader) throws {
        var model = model
        while let (field, value) = try model.next() {
            switch field {
            case 1:
                var reader = try value.message("pieces[\(pieces.count)]")
                var piece = "", score: Float = 0, type = 1
                while let (field, value) = try reader.next() {
                    switch field {
                    case 1: piece = try value.string("piece")
                    case 2: score = try value.float("score")
                    case 3: type = try value.int("type")
                    default: break
                    }
                }
                pieces.append(Piece(piece: piece, score: score, type: type))
            case 2:
                var trainer = try value.message("trainer_spec")
                while let (field, value) = try trainer.next() {
                    switch field {
                    case 3:
                        let raw = try value.int("model_type")
                        guard let type = ModelType(rawValue: raw) else {
                            throw TokenizerError.invalidField(file: file, path: "ModelProto.trainer_spec.model_type", reason: "unknown model type \(raw)")
                        }
                        modelType = type
                    case 35: byteFallback = try value.int("byte_fallback") != 0
                    case 40: unknownId = try value.int("unk_id")
                    default: break
                    }
                }
            case 3:
                var normalizer = try value.message("normalizer_spec")
                while let (field, value) = try normalizer.next() {
                    switch field {
                    case 2: precompiledCharsmap = try value.bytes("precompiled_charsmap")
                    case 3: addDummyPrefix = try value.int("add_dummy_prefix") != 0
                    case 4: removeExtraWhitespaces = try value.int("remove_extra_whitespaces") != 0
                    case 5: escapeWhitespaces = try value.int("escape_whitespaces") != 0
                    default: break
                    }
                }
            default: break
            }
        }
    }
}

/// The fields of one protobuf message, in wire order.
private struct ProtobufReader {
    enum Value {
        case varint(UInt64)
        case fixed32(UInt32)
        case fixed64(UInt64)
        case bytes(ArraySlice<UInt8>)
    }

    /// A field's value with the reader's file and path, for errors that name the field.
    struct Field {
        let value: Value
        let file: String
        let path: String

        func invalid(_ name: String, _ reason: String) -> TokenizerError {
            .invalidField(file: file, path: "\(path).\(name)", reason: reason)
        }

        func int(_ name: String) throws -> Int {
            guard case .varint(let raw) = value else { throw invalid(name, "expected a varint") }
            // int32 fields write negative values as ten-byte two's complement.
            return Int(truncatingIfNeeded: Int64(bitPattern: raw))
        }

        func float(_ name: String) throws -> Float {
            guard case .fixed32(let raw) = value else { throw invalid(name, "expected a 32-bit float") }
            return Float(bitPattern: raw)
        }

        func bytes(_ name: String) throws -> [UInt8] {
            guard case .bytes(let raw) = value else { throw invalid(name, "expected bytes") }
            return Array(raw)
        }

        func string(_ name: String) throws -> String {
            guard let text = String(validating: try bytes(name), as: UTF8.self) else { throw invalid(name, "not UTF-8") }
            return text
        }

        func message(_ name: String) throws -> ProtobufReader {
            guard case .bytes(let raw) = value else { throw invalid(name, "expected a message") }
            return ProtobufReader(raw, file: file, path: "\(path).\(name)")
        }
    }

    private let bytes: ArraySlice<UInt8>
    private var position: Int
    let file: String
    let path: String

    init(_ bytes: [UInt8], file: String, path: String) {
        self.init(bytes[...], file: file, path: path)
    }

    init(_ bytes: ArraySlice<UInt8>, file: String, path: String) {
        self.bytes = bytes
        position = bytes.startIndex
        self.file = file
        self.path = path
    }

    private func truncated() -> TokenizerError {
        .invalidField(file: file, path: path, reason: "truncated at byte \(position - bytes.startIndex)")
    }

    private mutating func varint() throws -> UInt64 {
        var result: UInt64 = 0
        for shift in stride(from: 0, to: 64, by: 7) {
            guard position < bytes.endIndex else { throw truncated() }
            let byte = bytes[position]
            position += 1
            result |= UInt64(byte & 0x7F) << UInt64(shift)
            if byte & 0x80 == 0 { return result }
        }
        throw TokenizerError.invalidField(file: file, path: path, reason: "a varint longer than 10 bytes")
    }

    private mutating func take(_ count: Int) throws -> ArraySlice<UInt8> {
        guard count >= 0, count <= bytes.endIndex - position else { throw truncated() }
        defer { position += count }
        return bytes[position..<(position + count)]
    }

    /// The next field number and value, nil at the end of the message.
    mutating func next() throws -> (Int, Field)? {
        guard position < bytes.endIndex else { return nil }
        let key = try varint()
        let value: Value
        switch key & 7 {
        case 0: value = .varint(try varint())
        case 1: value = .fixed64(try take(8).reversed().reduce(0) { $0 << 8 | UInt64($1) })
        case 2:
            let length = try varint()
            guard length <= UInt64(Int.max) else { throw truncated() }
            value = .bytes(try take(Int(length)))
        case 5: value = .fixed32(try take(4).reversed().reduce(0) { $0 << 8 | UInt32($1) })
        default:
            throw TokenizerError.invalidField(file: file, path: path, reason: "wire type \(key & 7) is not one SentencePiece files use")
        }
        return (Int(truncatingIfNeeded: key >> 3), Field(value: value, file: file, path: path))
    }
}
