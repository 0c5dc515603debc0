/// Turns generated token ids into text as they arrive, for streaming: each call returns only text no later token can
/// change, and never part of a UTF-8 character whose bytes are split across byte tokens.
///
/// Together the pieces (including ``finish()``) equal `tokenizer.decode(ids)` of all ids fed, as transformers'
/// `TextStreamer` prints them. Each step decodes a short window: the tokens already returned last time, as context
/// for decoders that treat the first token specially (a stripped leading space), and the new ones; the text beyond the
/// context's is new. While the window's text ends in U+FFFD (an incomplete character) it waits for more tokens.
public struct StreamingDetokenizer: Sendable {
    public let tokenizer: Tokenizer
    public let skipSpecialTokens: Bool
    private var ids: [Int] = []
    /// Start of the window: the tokens already returned whose text serves as context.
    private var contextStart = 0
    /// End of the context, start of the tokens not yet returned.
    private var pendingStart = 0

    public init(tokenizer: Tokenizer, skipSpecialTokens: Bool = true) {
        self.tokenizer = tokenizer
        self.skipSpecialTokens = skipSpecialTokens
    }

    /// Feeds one token; returns the text it completes (often empty).
    public mutating func append(_ id: Int) -> String {
        ids.append(id)
        let context = tokenizer.decode(Array(ids[contextStart..<pendingStart]), skipSpecialTokens: skipSpecialTokens)
        let window = tokenizer.decode(Array(ids[contextStart...]), skipSpecialTokens: skipSpecialTokens)
        guard window.unicodeScalars.last != "\u{FFFD}" else { return "" }
        let piece = Self.suffix(of: window, after: context)
        contextStart = pendingStart
        pendingStart = ids.count
        return piece
    }

    /// Returns whatever text is still held back (an incomplete character at the very end decodes as U+FFFD, as
    /// `tokenizer.decode` gives it), and starts over.
    public mutating func finish() -> String {
        let context = tokenizer.decode(Array(ids[contextStart..<pendingStart]), skipSpecialTokens: skipSpecialTokens)
        let window = tokenizer.decode(Array(ids[contextStart...]), skipSpecialTokens: skipSpecialTokens)
        ids = []
        contextStart = 0
        pendingStart = 0
        return Self.suffix(of: window, after: context)
    }

    /// `text` minus its first scalars that spell `prefix` (scalar-wise, so that a combining mark after the prefix does
    /// not merge into its last character).
    private static func suffix(of text: String, after prefix: String) -> String {
        let scalars = text.unicodeScalars
        let prefixCount = prefix.unicodeScalars.count
        guard scalars.count > prefixCount else { return "" }
        return String(String.UnicodeScalarView(scalars.dropFirst(prefixCount)))
    }
}
