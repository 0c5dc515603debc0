import Foundation
import Testing
@testable import VLMTokenizers

@Suite struct JSONParsingTests {
    /// oracle/tokenizer_json_numbers.py: the doubles tokenizers holds after reading each number, some of them one ulp
    /// away from the correctly rounded value.
    @Test func numbersReadAsTokenizersReadsThem() throws {
        struct Case: Decodable { let text: String; let read: String }
        let cases = try JSONDecoder().decode([Case].self, from: Data(contentsOf: fixturesDirectory.appendingPathComponent("json_numbers.json")))
        #expect(cases.count >= 400)
        var differentFromCorrectRounding = 0
        for item in cases {
            let expected = try #require(Double(item.read))
            if Double(item.text) != expected { differentFromCorrectRounding += 1 }
            let parsed = try TokenizerJSONParser.parse(Data("[\(item.text)]".utf8)) as? [Any]
            let value = try #require((parsed?.first as? NSNumber)?.doubleValue)
            #expect(value.bitPattern == expected.bitPattern, "\(item.text): \(value) != \(expected)")
        }
        // The fixture must exercise the serde_json rounding, not only agree with Double(String).
        #expect(differentFromCorrectRounding > 10)
    }

    @Test func canonicallyEquivalentKeysStayApart() throws {
        let json = #"{"version": "1.0", "model": {"type": "WordLevel", "unk_token": "?", "vocab": {"?": 0, "\u212B": 1, "\u00C5": 2, "\u1100\u1161": 3, "\uAC00": 4}}}"#
        let object = try JSONObject.parse(Data(json.utf8), file: "tokenizer.json")
        let model = try makeModel(try object.object("model"))
        #expect(model.vocabularySize == 5)
        #expect(model.tokenId("\u{212B}") == 1)
        #expect(model.tokenId("\u{00C5}") == 2)
        #expect(model.tokenId("\u{1100}\u{1161}") == 3)
        #expect(model.tokenId("\u{AC00}") == 4)
        #expect(model.token(1)?.unicodeScalars.first == "\u{212B}")
    }

    @Test func farApartIdsNeedNoGiantTable() throws {
        // The largest id tokenizers' u32 allows.
        let json = #"{"model": {"type": "WordLevel", "unk_token": "a", "vocab": {"a": 0, "b": 4294967295, "c": 2}}}"#
        let model = try makeModel(try JSONObject.parse(Data(json.utf8), file: "tokenizer.json").object("model"))
        #expect(model.tokenId("b") == 4_294_967_295)
        #expect(model.token(4_294_967_295) == "b")
        #expect(model.token(2) == "c")
        #expect(model.token(1) == nil)
    }

    @Test func malformedJSONFailsWithItsPosition() {
        for bad in ["{\"a\": 1,}", "[\"\\ud800\"]", "{\"a\" 1}", "[01]", "[1.]", "[1e]", String(repeating: "[", count: 200) + String(repeating: "]", count: 200), "{\"a\": 1} x", "[\"\u{01}\"]", "[1e999]"] {
            #expect(throws: TokenizerJSONParser.Failure.self, "\(bad)") { try TokenizerJSONParser.parse(Data(bad.utf8)) }
        }
        #expect(throws: TokenizerJSONParser.Failure.self) { try TokenizerJSONParser.parse(Data([0x5B, 0x22, 0xFF, 0x22, 0x5D])) }
    }
}
