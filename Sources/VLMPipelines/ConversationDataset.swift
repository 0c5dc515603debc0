import Foundation
import VLMTemplates

/// Conversations for supervised fine-tuning of a chat language model, as TRL's conversational datasets hold them: a
/// JSON-lines file (`load_dataset("json", data_files=…)`) whose `messages` column holds, per line, a list of
/// `{"role": …, "content": …}` messages in the chat format transformers' chat templates read, the content a string or
/// a list of text parts.
public struct ConversationDataset: Sendable {
    public let conversations: [[JSONValue]]

    /// Reads `file`. Every line must hold in `messagesColumn` a list of messages, each with a string role and a
    /// string or list-of-parts content, no image part, and at least one assistant message; the first that does not
    /// is the error.
    public init(file: URL, messagesColumn: String = "messages") throws {
        var isDirectory: ObjCBool = false
        guard FileManager.default.fileExists(atPath: file.path, isDirectory: &isDirectory) else {
            throw DatasetError(file: file.path, reason: "no such file (a conversation dataset is a JSON-lines file)")
        }
        guard !isDirectory.boolValue else {
            throw DatasetError(file: file.path, reason: "a directory, not the JSON-lines file of conversations a language model trains on")
        }
        let rows = try ImageFolderMetadata.jsonLines(ImageFolderMetadata.read(file), file: file.path)
        guard !rows.isEmpty else { throw DatasetError(file: file.path, reason: "no rows") }
        conversations = try rows.map { line, fields in
            try ConversationCheck(file: file, line: line, column: messagesColumn).messages(in: fields, imageParts: 0)
        }
    }
}

/// Image conversations laid out as 🤗 datasets' `imagefolder` with a `metadata.jsonl` whose `file_name` column names
/// each row's image and whose `messages` column holds the conversation about it in the chat format (see
/// ``ConversationDataset``), one of its content parts `{"type": "image"}`, where the image goes.
public struct ImageConversationDataset: Sendable {
    public struct Conversation: Sendable, Equatable {
        public let image: URL
        public let messages: [JSONValue]
    }

    public let conversations: [Conversation]

    /// Reads `directory/metadata.jsonl` (or a metadata.csv, whose text fields cannot hold messages). Every row must
    /// name an image file inside the directory and hold in `messagesColumn` a list of messages, each with a string
    /// role and a string or list-of-parts content, one image part among them all and at least one assistant message;
    /// the first that does not is the error.
    public init(directory: URL, messagesColumn: String = "messages") throws {
        let metadata = try ImageFolderMetadata(directory: directory)
        conversations = try metadata.rows.map { row in
            let check = ConversationCheck(file: metadata.file, line: row.line, column: messagesColumn)
            return Conversation(image: row.image, messages: try check.messages(in: row.fields, imageParts: 1))
        }
    }
}

/// What makes one row's column a conversation to learn from.
private struct ConversationCheck {
    let file: URL
    let line: Int
    let column: String

    func messages(in fields: [String: JSONValue], imageParts expected: Int) throws -> [JSONValue] {
        func failure(_ reason: String) -> DatasetError { DatasetError(file: file.path, reason: "line \(line): \(reason)") }
        guard let value = fields[column] else {
            throw failure("no \(column) (choose the conversation column with --messages-column)")
        }
        guard case let .array(messages) = value, !messages.isEmpty else {
            throw failure("\(column) is not a list of messages")
        }
        var imageParts = 0, replies = 0
        for (index, message) in messages.enumerated() {
            guard case let .string(role)? = message["role"] else { throw failure("message \(index) has no string role") }
            if role == "assistant" { replies += 1 }
            switch message["content"] {
            case .string?: break
            case let .array(parts)?:
                for part in parts {
                    guard case let .string(type)? = part["type"] else { throw failure("message \(index) has a content part without a type") }
                    if type == "image" { imageParts += 1 }
                }
            default: throw failure("message \(index)'s content is neither a string nor a list of parts")
            }
        }
        guard imageParts == expected else {
            throw failure(expected == 0 ? "the messages hold \(imageParts) image parts, and a language model reads no images"
                                        : "the messages hold \(imageParts) image parts for the row's one image")
        }
        guard replies > 0 else { throw failure("no assistant message to learn from") }
        return messages
    }
}
