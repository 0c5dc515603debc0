import Foundation
import Testing
import VLMImages

@Suite struct DrawingTests {
    static func blank(_ width: Int, _ height: Int, _ value: UInt8 = 100) -> RGBImage {
        RGBImage(width: width, height: height, pixels: [UInt8](repeating: value, count: width * height * 3))
    }

    func pixel(_ image: RGBImage, _ x: Int, _ y: Int) -> [UInt8] {
        Array(image.pixels[((y * image.width + x) * 3)..<((y * image.width + x) * 3 + 3)])
    }

    @Test func fillBlendsAndClips() {
        var image = Self.blank(10, 8)
        image.fill(PixelRect(x: 7, y: -2, width: 10, height: 4), color: RGBColor(red: 200, green: 0, blue: 255), opacity: 0.25)
        // 100·0.75 + 200·0.25 = 125; 100·0.75 = 75; 100·0.75 + 255·0.25 = 138.75.
        #expect(pixel(image, 7, 0) == [125, 75, 139])
        #expect(pixel(image, 9, 1) == [125, 75, 139])
        #expect(pixel(image, 6, 0) == [100, 100, 100])
        #expect(pixel(image, 7, 2) == [100, 100, 100])
    }

    @Test func strokeDrawsInsideTheEdges() {
        var image = Self.blank(20, 20)
        image.stroke(PixelRect(x: 2, y: 3, width: 12, height: 10), color: .white, lineWidth: 3)
        for (x, y) in [(2, 3), (4, 5), (13, 12), (11, 3), (2, 12), (13, 8)] { #expect(pixel(image, x, y) == [255, 255, 255], "\(x),\(y)") }
        for (x, y) in [(5, 6), (10, 9), (1, 3), (14, 3), (2, 13), (8, 2)] { #expect(pixel(image, x, y) == [100, 100, 100], "\(x),\(y)") }
    }

    @Test func tintFollowsTheWeights() {
        var image = Self.blank(3, 1)
        image.tint(.black, weights: [0, 0.5, 2], opacity: 0.5)
        #expect(image.pixels == [100, 100, 100, 75, 75, 75, 50, 50, 50])
    }

    /// A 6x6 square region in a 12x12 image, outlined 2 pixels wide: its outer two rings, nothing else.
    @Test func outlineMarksTheRegionsEdge() {
        var image = Self.blank(12, 12)
        let weights = (0..<144).map { i -> Float in (3..<9).contains(i % 12) && (3..<9).contains(i / 12) ? 0.9 : 0.1 }
        image.outline(.white, weights: weights, above: 0.5, lineWidth: 2)
        for y in 0..<12 {
            for x in 0..<12 {
                let inside = (3..<9).contains(x) && (3..<9).contains(y)
                let ring = inside && !((5..<7).contains(x) && (5..<7).contains(y))
                #expect(pixel(image, x, y) == (ring ? [255, 255, 255] : [100, 100, 100]), "\(x),\(y)")
            }
        }
    }

    @Test func regionsTouchingTheBorderAreNotOutlinedThere() {
        var image = Self.blank(8, 4)
        image.outline(.white, weights: [Float](repeating: 1, count: 32), above: 0.5, lineWidth: 1)
        #expect(image == Self.blank(8, 4))
    }

    /// At scale 1 a glyph is its bitmap; "l" in 9x18 bold has a vertical stem.
    @Test func textAtScaleOneIsTheBitmap() {
        let font = BitmapFont.fixed9x18Bold
        #expect(font.cellWidth == 9 && font.cellHeight == 18 && font.ascent == 14)
        var image = Self.blank(9, 18, 0)
        image.draw(text: "l", at: 0, 0, color: .white)
        let ink = image.pixels.enumerated().filter { $0.offset % 3 == 0 && $0.element > 0 }
        #expect(!ink.isEmpty)
        #expect(ink.allSatisfy { $0.element == 255 }, "scale 1 draws whole pixels")
        var again = Self.blank(9, 18, 0)
        again.draw(text: "l", at: 0, 0, color: .white, scale: 1)
        #expect(again == image)
        // Every ink pixel of "l" at scale 1 is ink at the centre of its 3x3 block at scale 3.
        var large = Self.blank(27, 54, 0)
        large.draw(text: "l", at: 0, 0, color: .white, scale: 3)
        for entry in ink {
            let (x, y) = (entry.offset / 3 % 9, entry.offset / 3 / 9)
            #expect(pixel(large, x * 3 + 1, y * 3 + 1) == [255, 255, 255])
        }
        let grey = large.pixels.filter { $0 > 0 && $0 < 255 }
        #expect(!grey.isEmpty, "edges at scale 3 are smoothed")
    }

    @Test func textOutsidePrintableASCIIDrawsAsItsLetterOrAQuestionMark() {
        let font = BitmapFont.fixed9x18Bold
        #expect(String(font.drawable("Ünïcödé 猫🚀")) == "Unicode ??")
        #expect(font.size(of: "Ünï", scale: 2) == (54, 36))
        var accented = Self.blank(27, 18, 0), plain = Self.blank(27, 18, 0)
        accented.draw(text: "é?x", at: 0, 0, color: .white)
        plain.draw(text: "e?x", at: 0, 0, color: .white)
        #expect(accented == plain)
    }

    @Test func stylesScaleWithThePicture() {
        let small = DrawingStyle(width: 300, height: 200)
        #expect(small.textScale == 1 && small.lineWidth == 2)
        let hd = DrawingStyle(width: 1920, height: 1080)
        #expect(hd.textScale == 2 && hd.lineWidth == 4)
        let large = DrawingStyle(width: 4000, height: 3000)
        #expect(large.textScale == 4 && large.lineWidth == 12)
        #expect(DrawingStyle(width: 3000, height: 4000) == large, "orientation does not change the style")
        #expect(large.labelHeight == 18 * 4 + 2 * large.padding)
    }

    @Test func labelColoursAreDistinct() {
        let colors = (0..<24).map(RGBColor.label)
        #expect(Set(colors).count == 24)
        #expect(RGBColor.white.contrasting == .black && RGBColor.black.contrasting == .white)
        #expect(RGBColor.label(2).contrasting == .black, "text on yellow is black")
        #expect(RGBColor.label(1).contrasting == .white, "text on blue is white")
    }

    /// The label sits above the box where there is room, inside it at the image's top, and shifts left at the
    /// right edge; its background is the box colour and its text the contrasting one.
    @Test func boxLabelsFindRoom() {
        let style = DrawingStyle(lineWidth: 2, textScale: 1, padding: 3)
        let red = RGBColor.label(0)
        var image = Self.blank(200, 120)
        image.drawBox(PixelRect(x: 10, y: 50, width: 80, height: 40), label: "cat 0.93", color: red, style: style)
        #expect(pixel(image, 10, 50) == [red.red, red.green, red.blue], "outline")
        #expect(pixel(image, 11, 50 - style.labelHeight) == [red.red, red.green, red.blue], "label background above the box")
        #expect(pixel(image, 11, 50 - style.labelHeight - 1) == [100, 100, 100])

        var top = Self.blank(200, 120)
        top.drawBox(PixelRect(x: 150, y: 0, width: 50, height: 60), label: "remote 0.41", color: red, style: style)
        let labelWidth = BitmapFont.fixed9x18Bold.size(of: "remote 0.41", scale: 1).width + 2 * style.padding
        #expect(pixel(top, 200 - labelWidth, 10) == [red.red, red.green, red.blue], "inside the box, moved left")
        #expect(pixel(top, 200 - labelWidth - 1, 10) == [100, 100, 100])
    }

    /// Two boxes with the same top-left corner: the second label goes inside its box, below the first.
    @Test func boxLabelsDoNotCoverEachOther() {
        let style = DrawingStyle(lineWidth: 1, textScale: 1, padding: 2)
        let (a, b) = (RGBColor.label(0), RGBColor.label(1))
        var image = Self.blank(200, 150)
        image.drawBoxes([
            LabeledBox(PixelRect(x: 20, y: 40, width: 100, height: 80), label: "one", color: a),
            LabeledBox(PixelRect(x: 20, y: 40, width: 60, height: 60), label: "two", color: b),
        ], style: style)
        #expect(pixel(image, 21, 40 - style.labelHeight) == [a.red, a.green, a.blue])
        #expect(pixel(image, 21, 41) == [b.red, b.green, b.blue])
    }

    @Test func overlayKeepsALargeImagesSizeWithTheLegendInside() {
        let image = Self.blank(600, 400)
        let weights = (0..<(600 * 400)).map { Float($0 % 600) / 600 }
        let overlay = image.segmentationOverlay([("left", weights.map { 1 - $0 }), ("right", weights)])
        #expect(overlay.width == 600 && overlay.height == 400)
        let first = RGBColor.label(0)
        let swatch = pixel(overlay, 3 + 3 + 5, 3 + 3 + 5)
        #expect(swatch == [first.red, first.green, first.blue], "the legend's first swatch")
        // At the right end only the second colour is left: half of it blended over the grey.
        let second = RGBColor.label(1)
        let blended = [second.red, second.green, second.blue].map { UInt8((Float(100) * 0.5 + Float($0) * 0.5).rounded()) }
        let right = pixel(overlay, 599, 200)
        #expect(zip(right, blended).allSatisfy { abs(Int($0) - Int($1)) <= 1 }, "\(right) vs \(blended)")
    }

    @Test func overlayOfASmallImageAddsALegendStrip() {
        let image = Self.blank(60, 40)
        let overlay = image.segmentationOverlay([("a cup of coffee", [Float](repeating: 0, count: 2400))])
        let style = DrawingStyle(width: 60, height: 40)
        let legend = RGBImage.legendSize([("a cup of coffee", .label(0))], style: style)
        #expect(overlay.width == legend.width + 2 * style.padding && overlay.height == 40 + legend.height + 2 * style.padding)
        #expect(pixel(overlay, 30, 20) == [100, 100, 100], "the image itself, untinted")
    }
}
