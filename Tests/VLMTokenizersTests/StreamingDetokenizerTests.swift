import Foundation
import Testing
import VLMTokenizers

@Suite struct StreamingDetokenizerTests {
    static let texts = [
        "Hello, world! 你好，世界。 Grüße 👋🏽 from the café — naïve résumé.",
        "Emoji: 🧑‍🚀🚀 and CJK 漢字かな交じり文; then ASCII again.\nNew line 😀",
        "  leading spaces, tabs\tand trailing ",
    ]

    /// Feeds `ids` one at a time; checks that every piece is final (a prefix of the full decode, no U+FFFD) and that
    /// the pieces add up to `tokenizer.decode(ids)`.
    func expectStreams(_ tokenizer: Tokenizer, _ ids: [Int], _ label: String) {
        let full = tokenizer.decode(ids, skipSpecialTokens: true)
        var streamer = StreamingDetokenizer(tokenizer: tokenizer)
        var text = ""
        for id in ids {
            let piece = streamer.append(id)
            #expect(!piece.unicodeScalars.contains("\u{FFFD}"), "\(label): \(piece)")
            text += piece
            #expect(full.unicodeScalars.starts(with: text.unicodeScalars), "\(label): \(text)")
        }
        text += streamer.finish()
        #expect(text == full, "\(label)")
    }

    @Test func smolLM2ByteLevelPiecesAddUpToTheDecode() throws {
        let tokenizer = try Tokenizer(directory: fixturesDirectory.appendingPathComponent("real/smollm2"))
        var splitCharacters = 0
        for text in Self.texts {
            let ids = tokenizer.encode(text).ids
            splitCharacters += ids.filter { tokenizer.decode([$0]).contains("\u{FFFD}") }.count
            expectStreams(tokenizer, ids, text)
        }
        // Some characters really are split across byte tokens, or the test would prove nothing.
        #expect(splitCharacters > 0)
    }

    @Test func byteFallbackPiecesAddUpToTheDecode() throws {
        let tokenizer = try Tokenizer(directory: fixturesDirectory.appendingPathComponent("llama-style"))
        var byteTokens = 0
        for text in Self.texts {
            let ids = tokenizer.encode(text).ids
            byteTokens += ids.filter { tokenizer.token($0)?.hasPrefix("<0x") == true }.count
            expectStreams(tokenizer, ids, text)
        }
        #expect(byteTokens > 0)
    }

    @Test func anIncompleteCharacterAtTheEndIsHeldUntilFinish() throws {
        let tokenizer = try Tokenizer(directory: fixturesDirectory.appendingPathComponent("real/smollm2"))
        let ids = tokenizer.encode("a 🚀").ids
        var streamer = StreamingDetokenizer(tokenizer: tokenizer)
        var text = ""
        for id in ids.dropLast() { text += streamer.append(id) }
        #expect(!text.contains("\u{FFFD}"))
        text += streamer.finish()
        #expect(text == tokenizer.decode(Array(ids.dropLast())))
    }
}
