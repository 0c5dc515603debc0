import Foundation
import VLMImages
import VLMTemplates

/// Where an image part of a chat message says its image is: the value of one of its source keys.
public struct ChatImageReference: Sendable, Equatable {
    /// The index of the message holding the part.
    public var message: Int
    /// "image", "url", "path" or "base64".
    public var key: String
    public var value: String

    public init(message: Int, key: String, value: String) {
        self.message = message
        self.key = key
        self.value = value
    }
}

/// The images a conversation holds, found and read as transformers' processors do in `apply_chat_template`: every
/// `{"type": "image", …}` part of every message, in order, by the value of each of its "image", "url", "path" and
/// "base64" keys that is present.
public enum ChatImages {
    static let sourceKeys = ["image", "url", "path", "base64"]

    /// The references of the messages' image parts, in order.
    public static func references(in messages: [JSONValue]) -> [ChatImageReference] {
        messages.enumerated().flatMap { index, message in
            imageParts(of: message).flatMap { part in
                sourceKeys.compactMap { key in
                    guard case let .string(value)? = part[key] else { return nil }
                    return ChatImageReference(message: index, key: key, value: value)
                }
            }
        }
    }

    /// The index of the first message with an image part, if any.
    static func firstMessageWithImages(_ messages: [JSONValue]) -> Int? {
        messages.firstIndex { !imageParts(of: $0).isEmpty }
    }

    private static func imageParts(of message: JSONValue) -> [JSONValue] {
        guard case let .array(parts)? = message["content"] else { return [] }
        return parts.filter { $0["type"] == .string("image") }
    }

    /// Reads the image a reference names: a path (relative to the current directory), a `file://` URL, a
    /// `data:image/…;base64,…` URL, or base64 text under "base64". Web URLs are refused: SwiftVLM reads no network
    /// for images (download the image and give its path).
    public static func load(_ reference: ChatImageReference) throws -> RGBImage {
        let value = reference.value
        let shown = value.count > 80 ? String(value.prefix(77)) + "..." : value
        func unreadable(_ reason: String) -> PipelineError {
            .unreadableImage(reference: "message \(reference.message): image \"\(shown)\"", reason: reason)
        }
        if reference.key == "base64" {
            guard let data = Data(base64Encoded: value, options: .ignoreUnknownCharacters) else { throw unreadable("not valid base64") }
            return try ImageDecoder.decode([UInt8](data), name: "message \(reference.message): base64 image")
        }
        if value.hasPrefix("data:") {
            guard let comma = value.firstIndex(of: ","), value[..<comma].hasSuffix(";base64"),
                  value.hasPrefix("data:image/") else {
                throw unreadable("a data URL must be data:image/<type>;base64,<data>")
            }
            guard let data = Data(base64Encoded: String(value[value.index(after: comma)...]), options: .ignoreUnknownCharacters) else {
                throw unreadable("the data URL's payload is not valid base64")
            }
            return try ImageDecoder.decode([UInt8](data), name: "message \(reference.message): data URL")
        }
        if value.hasPrefix("file:") {
            guard let url = URL(string: value), url.isFileURL, !url.path.isEmpty else { throw unreadable("not a valid file URL") }
            return try ImageDecoder.decode(contentsOf: url)
        }
        if value.hasPrefix("http://") || value.hasPrefix("https://") {
            throw unreadable("images are not downloaded: save it and give its path")
        }
        return try ImageDecoder.decode(contentsOf: URL(fileURLWithPath: value))
    }
}
