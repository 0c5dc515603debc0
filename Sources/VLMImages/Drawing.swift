import Foundation

// Drawing on RGB images: alpha-blended tints of per-pixel weights (masks, probability maps), rectangles, filled label
// backgrounds, text in a built-in bitmap font, labelled boxes and legends. Everything clips to the image, and sizes
// come from a DrawingStyle that scales with the picture, so that a label reads the same on a 300-pixel photo and on a
// 4000-pixel one.

/// An 8-bit sRGB colour.
public struct RGBColor: Sendable, Hashable {
    public var red: UInt8
    public var green: UInt8
    public var blue: UInt8

    public init(red: UInt8, green: UInt8, blue: UInt8) {
        self.red = red
        self.green = green
        self.blue = blue
    }

    public static let black = RGBColor(red: 0, green: 0, blue: 0)
    public static let white = RGBColor(red: 255, green: 255, blue: 255)

    /// Black or white, whichever stands out more on this colour (by its Rec. 709 luma).
    public var contrasting: RGBColor {
        0.2126 * Double(red) + 0.7152 * Double(green) + 0.0722 * Double(blue) > 140 ? .black : .white
    }

    /// The `index`-th of a sequence of distinct label colours: ten picked to tell apart at a glance (red, blue,
    /// yellow, green, magenta, cyan, orange, violet, lime, pink), then hues a golden angle apart (each next hue lands
    /// in the largest gap left), all vivid enough to show as a tint and under text.
    public static func label(_ index: Int) -> RGBColor {
        let picked: [(UInt8, UInt8, UInt8)] = [
            (230, 57, 50), (38, 105, 230), (250, 204, 28), (34, 168, 76), (214, 60, 200),
            (28, 200, 222), (247, 132, 28), (124, 74, 210), (168, 226, 48), (250, 122, 172),
        ]
        if index >= 0 && index < picked.count {
            return RGBColor(red: picked[index].0, green: picked[index].1, blue: picked[index].2)
        }
        let hue = (Double(index) * 0.618_033_988_749_895).truncatingRemainder(dividingBy: 1)
        return RGBColor(hue: abs(hue), saturation: 0.8, value: index % 2 == 0 ? 0.95 : 0.8)
    }

    /// From hue (0..<1 of a turn), saturation and value, each 0...1.
    init(hue: Double, saturation: Double, value: Double) {
        let sector = hue * 6, f = sector - sector.rounded(.down)
        let (p, q, t) = (value * (1 - saturation), value * (1 - saturation * f), value * (1 - saturation * (1 - f)))
        let (r, g, b): (Double, Double, Double) = switch Int(sector) % 6 {
        case 0: (value, t, p)
        case 1: (q, value, p)
        case 2: (p, value, t)
        case 3: (p, q, value)
        case 4: (t, p, value)
        default: (value, p, q)
        }
        self.init(red: UInt8((r * 255).rounded()), green: UInt8((g * 255).rounded()), blue: UInt8((b * 255).rounded()))
    }
}

/// A rectangle of whole pixels: `x`, `y` its top-left corner, `width`×`height` pixels from there. It may reach
/// outside an image; drawing clips it.
public struct PixelRect: Sendable, Equatable {
    public var x: Int
    public var y: Int
    public var width: Int
    public var height: Int

    public init(x: Int, y: Int, width: Int, height: Int) {
        self.x = x
        self.y = y
        self.width = width
        self.height = height
    }

    /// The pixels a box of real corners covers: `left`…`right` and `top`…`bottom` rounded to the nearest pixel edges
    /// (a detector's box in image coordinates).
    public init(left: Double, top: Double, right: Double, bottom: Double) {
        let (x0, y0) = (Int(left.rounded()), Int(top.rounded()))
        self.init(x: x0, y: y0, width: max(0, Int(right.rounded()) - x0), height: max(0, Int(bottom.rounded()) - y0))
    }
}

/// Sizes of lines and text, in pixels. ``init(width:height:)`` scales them with the picture.
public struct DrawingStyle: Sendable, Equatable {
    /// Width of box outlines and region edges.
    public var lineWidth: Int
    /// How many times larger than its pixel size the font draws.
    public var textScale: Int
    /// Space between text and the edge of its background, and between the legend and the image's edge.
    public var padding: Int
    public var font: BitmapFont

    public init(lineWidth: Int, textScale: Int, padding: Int, font: BitmapFont = .fixed9x18Bold) {
        self.lineWidth = max(1, lineWidth)
        self.textScale = max(1, textScale)
        self.padding = max(0, padding)
        self.font = font
    }

    /// The style for a picture of this size, from its shorter side: the font at its own 18 pixels up to 1080 pixels,
    /// then a multiple of it (2 at 1080, 4 at 3000), lines 2 pixels wide and more from 500 pixels on (12 at 3000).
    public init(width: Int, height: Int) {
        let side = Double(max(1, min(width, height)))
        let scale = max(1, Int((side / 720).rounded()))
        self.init(lineWidth: max(2, Int((side / 250).rounded())), textScale: scale, padding: 3 * scale)
    }

    /// The height of one line of text with its background.
    public var labelHeight: Int { font.cellHeight * textScale + 2 * padding }
}

extension RGBImage {
    /// Blends `color` over pixel (`x`, `y`) with opacity `alpha` (0...1); pixels outside the image are left alone.
    @inline(__always)
    private mutating func blend(x: Int, y: Int, _ color: RGBColor, alpha: Float) {
        guard x >= 0, y >= 0, x < width, y < height, alpha > 0 else { return }
        let at = (y * width + x) * 3, a = min(alpha, 1)
        func mix(_ base: UInt8, _ top: UInt8) -> UInt8 { UInt8((Float(base) * (1 - a) + Float(top) * a).rounded()) }
        pixels[at] = mix(pixels[at], color.red)
        pixels[at + 1] = mix(pixels[at + 1], color.green)
        pixels[at + 2] = mix(pixels[at + 2], color.blue)
    }

    /// Tints every pixel toward `color` by `opacity` times its weight: `weights` holds one value per pixel, row by row
    /// (a mask or a probability map the size of the image), read as clamped to 0...1.
    public mutating func tint(_ color: RGBColor, weights: [Float], opacity: Float) {
        precondition(weights.count == width * height, "\(weights.count) weights for a \(width)x\(height) image")
        for y in 0..<height {
            for x in 0..<width {
                blend(x: x, y: y, color, alpha: opacity * min(max(weights[y * width + x], 0), 1))
            }
        }
    }

    /// Draws the edge of the region where `weights` (one per pixel, as for ``tint(_:weights:opacity:)``) exceed
    /// `threshold`, in `color`: the region's pixels within `lineWidth` pixels (along rows, columns and diagonals) of
    /// a pixel outside it. The image's border is not an edge.
    public mutating func outline(_ color: RGBColor, weights: [Float], above threshold: Float, lineWidth: Int) {
        precondition(weights.count == width * height, "\(weights.count) weights for a \(width)x\(height) image")
        let inside = weights.map { $0 > threshold }
        let reach = max(1, lineWidth), far = Int.max / 4
        /// For each index of a line of `count` flags, whether a set flag lies within `reach` of it.
        func near(_ count: Int, _ flag: (Int) -> Bool) -> [Bool] {
            var after = [Int](repeating: far, count: count)
            var next = far
            for i in stride(from: count - 1, through: 0, by: -1) {
                if flag(i) { next = i }
                after[i] = next
            }
            var before = -far
            return (0..<count).map { i in
                if flag(i) { before = i }
                return i - before <= reach || after[i] - i <= reach
            }
        }
        // Outside pixels spread along rows, then along columns: a square neighbourhood.
        var nearRow = [Bool](repeating: false, count: inside.count)
        for y in 0..<height {
            let row = near(width) { !inside[y * width + $0] }
            for x in 0..<width { nearRow[y * width + x] = row[x] }
        }
        for x in 0..<width {
            let column = near(height) { nearRow[$0 * width + x] }
            for y in 0..<height where inside[y * width + x] && column[y] { blend(x: x, y: y, color, alpha: 1) }
        }
    }

    /// Fills `rect` with `color` at `opacity`.
    public mutating func fill(_ rect: PixelRect, color: RGBColor, opacity: Float = 1) {
        let (x0, y0) = (max(rect.x, 0), max(rect.y, 0))
        let (x1, y1) = (min(rect.x + rect.width, width), min(rect.y + rect.height, height))
        guard x0 < x1, y0 < y1 else { return }
        for y in y0..<y1 {
            for x in x0..<x1 { blend(x: x, y: y, color, alpha: opacity) }
        }
    }

    /// Outlines `rect` with lines `lineWidth` pixels wide, drawn inside its edges.
    public mutating func stroke(_ rect: PixelRect, color: RGBColor, lineWidth: Int) {
        let line = max(1, min(lineWidth, (rect.width + 1) / 2, (rect.height + 1) / 2))
        guard rect.width > 0, rect.height > 0 else { return }
        fill(PixelRect(x: rect.x, y: rect.y, width: rect.width, height: line), color: color)
        fill(PixelRect(x: rect.x, y: rect.y + rect.height - line, width: rect.width, height: line), color: color)
        fill(PixelRect(x: rect.x, y: rect.y + line, width: line, height: rect.height - 2 * line), color: color)
        fill(PixelRect(x: rect.x + rect.width - line, y: rect.y + line, width: line, height: rect.height - 2 * line),
             color: color)
    }

    /// Draws `text` with its top-left corner at (`x`, `y`), each glyph `scale` times its size with smoothed edges.
    /// Characters outside printable ASCII draw as their unaccented letter or "?".
    public mutating func draw(text: String, at x: Int, _ y: Int, color: RGBColor, font: BitmapFont = .fixed9x18Bold,
                              scale: Int = 1) {
        let scale = max(1, scale)
        for (position, character) in font.drawable(text).enumerated() {
            guard let glyph = font.glyphIndex(character) else { continue }
            let left = x + position * font.cellWidth * scale
            guard left < width, left + font.cellWidth * scale > 0 else { continue }
            for row in 0..<(font.cellHeight * scale) {
                for column in 0..<(font.cellWidth * scale) {
                    blend(x: left + column, y: y + row, color,
                          alpha: font.coverage(glyph: glyph, x: column, y: row, scale: scale))
                }
            }
        }
    }

    /// Draws `text` on a filled background of `color` (the text black or white, whichever reads better on it) with
    /// its top-left corner at (`x`, `y`), and returns the rectangle it took.
    @discardableResult
    public mutating func drawLabel(_ text: String, at x: Int, _ y: Int, color: RGBColor, style: DrawingStyle,
                                   opacity: Float = 1) -> PixelRect {
        let size = style.font.size(of: text, scale: style.textScale)
        let rect = PixelRect(x: x, y: y, width: size.width + 2 * style.padding, height: style.labelHeight)
        fill(rect, color: color, opacity: opacity)
        draw(text: text, at: x + style.padding, y + style.padding, color: color.contrasting, font: style.font,
             scale: style.textScale)
        return rect
    }

    /// A detector's box: `box` outlined in `color`, and `label` (e.g. "cat 0.93") on a background of that colour
    /// just above its top-left corner, or inside it where there is no room above.
    public mutating func drawBox(_ box: PixelRect, label: String?, color: RGBColor, style: DrawingStyle) {
        drawBoxes([LabeledBox(box, label: label, color: color)], style: style)
    }

    /// Several detections: every outline first, then the labels, so that no outline crosses a label; each label goes
    /// to the first of above the box, inside its top, below it and inside its bottom that stays in the image and
    /// overlaps no label placed before it (else the first that stays in the image), shifted left where it would
    /// run off the right edge.
    public mutating func drawBoxes(_ boxes: [LabeledBox], style: DrawingStyle) {
        for box in boxes { stroke(box.rect, color: box.color, lineWidth: style.lineWidth) }
        var placed: [PixelRect] = []
        for box in boxes {
            guard let label = box.label else { continue }
            let size = style.font.size(of: label, scale: style.textScale)
            let (labelWidth, labelHeight) = (size.width + 2 * style.padding, style.labelHeight)
            let x = max(0, min(box.rect.x, width - labelWidth))
            let rows = [box.rect.y - labelHeight, box.rect.y, box.rect.y + box.rect.height,
                        box.rect.y + box.rect.height - labelHeight]
            let candidates = rows.filter { $0 >= 0 && $0 + labelHeight <= height }
                .map { PixelRect(x: x, y: $0, width: labelWidth, height: labelHeight) }
            let free = candidates.first { candidate in !placed.contains { $0.intersects(candidate) } }
            let spot = free ?? candidates.first ?? PixelRect(x: x, y: max(0, box.rect.y), width: labelWidth, height: labelHeight)
            placed.append(drawLabel(label, at: spot.x, spot.y, color: box.color, style: style))
        }
    }

    /// The width and height ``drawLegend(_:at:_:style:)`` takes for `entries`.
    public static func legendSize(_ entries: [(label: String, color: RGBColor)], style: DrawingStyle) -> (width: Int, height: Int) {
        guard !entries.isEmpty else { return (0, 0) }
        let swatch = style.font.cellHeight * style.textScale
        let widest = entries.map { style.font.size(of: $0.label, scale: style.textScale).width }.max() ?? 0
        return (2 * style.padding + swatch + legendGap(style) + widest, style.padding + entries.count * (swatch + style.padding))
    }

    private static func legendGap(_ style: DrawingStyle) -> Int { style.padding + 2 * style.textScale }

    /// A legend with its top-left corner at (`x`, `y`): one row per entry, a swatch of its colour and its label in
    /// white, on a dark translucent panel.
    public mutating func drawLegend(_ entries: [(label: String, color: RGBColor)], at x: Int, _ y: Int, style: DrawingStyle) {
        let size = Self.legendSize(entries, style: style)
        guard size.width > 0 else { return }
        fill(PixelRect(x: x, y: y, width: size.width, height: size.height), color: .black, opacity: 0.6)
        let swatch = style.font.cellHeight * style.textScale
        for (row, entry) in entries.enumerated() {
            let top = y + style.padding + row * (swatch + style.padding)
            let square = PixelRect(x: x + style.padding, y: top, width: swatch, height: swatch)
            fill(square, color: entry.color)
            stroke(square, color: .white, lineWidth: style.textScale)
            draw(text: entry.label, at: square.x + swatch + Self.legendGap(style), top, color: .white, font: style.font,
                 scale: style.textScale)
        }
    }
}

/// A box to draw with ``RGBImage/drawBoxes(_:style:)``: where, its label (nil for none) and its colour.
public struct LabeledBox: Sendable, Equatable {
    public var rect: PixelRect
    public var label: String?
    public var color: RGBColor

    public init(_ rect: PixelRect, label: String?, color: RGBColor) {
        self.rect = rect
        self.label = label
        self.color = color
    }
}

extension PixelRect {
    /// Whether the two rectangles share a pixel.
    public func intersects(_ other: PixelRect) -> Bool {
        x < other.x + other.width && other.x < x + width && y < other.y + other.height && other.y < y + height
    }
}

extension RGBImage {
    /// The picture of a segmentation: each region tinted in its label colour (``RGBColor/label(_:)``, in order) by
    /// half its probability, the edge of where it exceeds 0.5 drawn in that colour, and a legend of the labels. The
    /// legend goes in the top-left corner where it covers at most a sixth of the picture; otherwise (small pictures,
    /// many or long labels) in a dark strip added below it, the picture widened where the legend is wider.
    ///
    /// - Parameter regions: each label with its probability map, one value per pixel of the image, row by row.
    public func segmentationOverlay(_ regions: [(label: String, probabilities: [Float])], style: DrawingStyle? = nil) -> RGBImage {
        let style = style ?? DrawingStyle(width: width, height: height)
        var picture = self
        for (index, region) in regions.enumerated() {
            picture.tint(.label(index), weights: region.probabilities, opacity: 0.5)
        }
        for (index, region) in regions.enumerated() {
            picture.outline(.label(index), weights: region.probabilities, above: 0.5, lineWidth: max(1, style.lineWidth / 2))
        }
        let entries = regions.enumerated().map { (label: $0.element.label, color: RGBColor.label($0.offset)) }
        let legend = Self.legendSize(entries, style: style)
        let fits = legend.width + 2 * style.padding <= width && legend.height + 2 * style.padding <= height
        if fits && legend.width * legend.height * 6 <= width * height {
            picture.drawLegend(entries, at: style.padding, style.padding, style: style)
            return picture
        }
        let (canvasWidth, canvasHeight) = (max(width, legend.width + 2 * style.padding), height + legend.height + 2 * style.padding)
        var canvas = RGBImage(width: canvasWidth, height: canvasHeight,
                              pixels: [UInt8](repeating: 32, count: canvasWidth * canvasHeight * 3))
        canvas.paste(picture)
        canvas.drawLegend(entries, at: style.padding, height + style.padding, style: style)
        return canvas
    }

    /// `image` copied in at the top-left corner.
    private mutating func paste(_ image: RGBImage) {
        let rowBytes = min(image.width, width) * 3
        for y in 0..<min(image.height, height) {
            pixels.replaceSubrange((y * width * 3)..<(y * width * 3 + rowBytes),
                                   with: image.pixels[(y * image.width * 3)..<(y * image.width * 3 + rowBytes)])
        }
    }
}
