import Foundation

/// A fixed-width one-bit font of printable ASCII, drawn at any integer scale with its edges smoothed (see
/// ``RGBImage/draw(text:at:color:font:scale:)``). ``fixed9x18Bold`` is the built-in one.
public struct BitmapFont: Sendable, Equatable {
    /// Pixels from one character's left edge to the next one's, at scale 1.
    public let cellWidth: Int
    /// Pixels from the top of the tallest glyph to the bottom of the deepest descender, at scale 1.
    public let cellHeight: Int
    /// Pixels from a cell's top to the baseline, at scale 1.
    public let ascent: Int
    private let firstCharacter: Int
    /// Per glyph, `cellHeight` rows of `cellWidth` flags, row by row.
    private let bits: [[Bool]]

    /// A font from one hex string per character, starting at `firstCharacter`: `cellHeight` rows of
    /// `⌈cellWidth / 4⌉` hex digits each, the leftmost pixel in the most significant bit.
    init(cellWidth: Int, cellHeight: Int, ascent: Int, firstCharacter: Int, rows: [String]) {
        let digits = (cellWidth + 3) / 4
        self.cellWidth = cellWidth
        self.cellHeight = cellHeight
        self.ascent = ascent
        self.firstCharacter = firstCharacter
        bits = rows.map { glyph in
            let text = Array(glyph.utf8)
            precondition(text.count == digits * cellHeight, "glyph rows of \(text.count) digits, not \(digits * cellHeight)")
            return (0..<cellHeight).flatMap { row -> [Bool] in
                let value = Int(String(decoding: text[(row * digits)..<((row + 1) * digits)], as: UTF8.self), radix: 16)!
                return (0..<cellWidth).map { column in value & (1 << (digits * 4 - 1 - column)) != 0 }
            }
        }
    }

    /// The characters `text` draws as: each letter with its accents dropped (é as e), anything else outside
    /// printable ASCII as "?".
    public func drawable(_ text: String) -> [Character] {
        text.folding(options: .diacriticInsensitive, locale: nil).map { character in
            glyphIndex(character) == nil ? "?" : character
        }
    }

    /// The width and height `text` takes at `scale`.
    public func size(of text: String, scale: Int) -> (width: Int, height: Int) {
        (drawable(text).count * cellWidth * scale, cellHeight * scale)
    }

    func glyphIndex(_ character: Character) -> Int? {
        guard let ascii = character.asciiValue, Int(ascii) >= firstCharacter, Int(ascii) - firstCharacter < bits.count else {
            return nil
        }
        return Int(ascii) - firstCharacter
    }

    /// How much of output pixel (`x`, `y`) of the glyph's cell drawn `scale` times larger is ink, 0...1: the bitmap
    /// read between its pixels (bilinearly, outside the cell blank), its 0.5 level taken as the outline, and a ramp one
    /// output pixel wide across it. At scale 1 this is the bitmap itself; larger, the pixel staircases of diagonals
    /// and corners come out as smooth edges instead of blocks.
    func coverage(glyph: Int, x: Int, y: Int, scale: Int) -> Float {
        let s = Float(scale)
        let u = (Float(x) + 0.5) / s - 0.5, v = (Float(y) + 0.5) / s - 0.5
        let column = Int(u.rounded(.down)), row = Int(v.rounded(.down))
        let (fx, fy) = (u - Float(column), v - Float(row))
        let cell = bits[glyph]
        func ink(_ c: Int, _ r: Int) -> Float {
            c >= 0 && c < cellWidth && r >= 0 && r < cellHeight && cell[r * cellWidth + c] ? 1 : 0
        }
        let level = (ink(column, row) * (1 - fx) + ink(column + 1, row) * fx) * (1 - fy)
            + (ink(column, row + 1) * (1 - fx) + ink(column + 1, row + 1) * fx) * fy
        return min(max((level - 0.5) * s + 0.5, 0), 1)
    }
}
