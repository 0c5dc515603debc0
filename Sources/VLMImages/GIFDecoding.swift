/// GIF read by hand as Pillow reads the first frame (GifImagePlugin and libImaging's GifDecode): the logical screen,
/// grown to the frame if the frame reaches past it, filled with the frame's transparent index (else 0), the frame's LZW
/// pixels at its offset, then `convert("RGB")` through the local or global palette (or as grey without one).
enum GIFDecoding {
    struct Refusal: Error {
        let reason: String
        init(_ reason: String) { self.reason = reason }
    }

    static func decode(_ data: [UInt8], name: String) throws -> (image: RGBImage, orientation: Int) {
        do {
            return (try image(data, name: name), 1)
        } catch let error as Refusal {
            throw ImageError.corrupt(file: name, format: "GIF", reason: error.reason)
        }
    }

    /// `_is_palette_needed`: false when every entry i is (i, i, i). Its chained comparison reads an entry cut short by
    /// the end of the file only as far as it matches, and fails (IndexError) past the end.
    private static func isNeeded(_ palette: ArraySlice<UInt8>) throws -> Bool {
        for i in stride(from: 0, to: palette.count, by: 3) {
            for c in 0..<3 {
                let at = palette.startIndex + i + c
                guard at < palette.endIndex else { throw Refusal("truncated palette") }
                if Int(palette[at]) != i / 3 { return true }
            }
        }
        return false
    }

    private static func image(_ data: [UInt8], name: String) throws -> RGBImage {
        guard data.count >= 13 else { throw Refusal("truncated header") }
        func u16(_ at: Int) -> Int { Int(data[at]) | Int(data[at + 1]) << 8 }
        var width = u16(6), height = u16(8)
        let flags = data[10]
        var at = 13
        // The palette as Pillow reads it (possibly cut short by the end of the file).
        func palette(bits: Int) throws -> ArraySlice<UInt8>? {
            let bytes = data[at..<min(at + (3 << bits), data.count)]
            at += bytes.count
            return try isNeeded(bytes) ? bytes : nil
        }
        let global = flags & 0x80 != 0 ? try palette(bits: Int(flags & 7) + 1) : nil

        // Blocks up to the first image descriptor: extensions are read, stray bytes skipped.
        func next() -> UInt8? {
            guard at < data.count else { return nil }
            at += 1
            return data[at - 1]
        }
        /// Pillow's `data()`: one sub-block, nil for the terminator (or the end of the file).
        func subBlock() -> ArraySlice<UInt8>? {
            guard let size = next(), size > 0 else { return nil }
            let block = data[at..<min(at + Int(size), data.count)]
            at += block.count
            return block
        }
        guard let first = next(), first != 0x3B else { throw Refusal("no image in the file") }
        var byte: UInt8? = first
        var transparency: Int?
        var descriptor: ArraySlice<UInt8>?
        while true {
            guard let s = byte ?? next(), s != 0x3B else { break }
            byte = nil
            if s == 0x21 {
                guard let label = next() else { break }
                let block = subBlock()
                if label == 0xF9, let block {
                    guard block.count >= 4 else { throw Refusal("truncated graphic control extension") }
                    if block[block.startIndex] & 1 != 0 { transparency = Int(block[block.startIndex + 3]) }
                } else if label == 0xFE {
                    var more = block
                    while more != nil { more = subBlock() }
                    continue
                }
                while subBlock() != nil {}
            } else if s == 0x2C {
                guard at + 9 <= data.count else { throw Refusal("truncated image descriptor") }
                descriptor = data[at..<(at + 9)]
                at += 9
                break
            }
        }
        guard let descriptor else { throw Refusal("image not found in GIF frame") }
        let d = descriptor.startIndex
        let x0 = Int(descriptor[d]) | Int(descriptor[d + 1]) << 8, y0 = Int(descriptor[d + 2]) | Int(descriptor[d + 3]) << 8
        let frameWidth = Int(descriptor[d + 4]) | Int(descriptor[d + 5]) << 8
        let frameHeight = Int(descriptor[d + 6]) | Int(descriptor[d + 7]) << 8
        width = max(width, x0 + frameWidth)
        height = max(height, y0 + frameHeight)
        let frameFlags = descriptor[d + 8]
        var local: ArraySlice<UInt8>?? = .none
        if frameFlags & 0x80 != 0 { local = .some(try palette(bits: Int(frameFlags & 7) + 1)) }
        // A local palette Pillow drops leaves the frame grey, not under the global palette.
        let colours: ArraySlice<UInt8>? = local ?? global
        guard let codeSize = next() else { throw Refusal("truncated image data") }

        try ImageDecoder.checkDimensions(width: width, height: height, name: name, format: "GIF")
        guard frameWidth > 0, frameHeight > 0 else { throw Refusal("the frame is \(frameWidth)x\(frameHeight)") }
        var indices = [UInt8](repeating: UInt8(transparency ?? 0), count: width * height)
        try decodeLZW(data, from: at, codeSize: Int(codeSize), interlaced: frameFlags & 0x40 != 0,
                      into: &indices, canvasWidth: width, x0: x0, y0: y0, width: frameWidth, height: frameHeight)

        var rgb = [UInt8](repeating: 0, count: width * height * 3)
        for (i, index) in indices.enumerated() {
            if let colours {
                let entry = colours.startIndex + Int(index) * 3
                if entry + 3 <= colours.endIndex {
                    (rgb[i * 3], rgb[i * 3 + 1], rgb[i * 3 + 2]) = (colours[entry], colours[entry + 1], colours[entry + 2])
                }
            } else {
                (rgb[i * 3], rgb[i * 3 + 1], rgb[i * 3 + 2]) = (index, index, index)
            }
        }
        return RGBImage(width: width, height: height, pixels: rgb)
    }

    /// libImaging's GifDecode over the rest of the file: the frame must fill before the data (or its end code) runs
    /// out, as Pillow then finds the file truncated.
    private static func decodeLZW(_ data: [UInt8], from start: Int, codeSize bits: Int, interlaced: Bool,
                                  into canvas: inout [UInt8], canvasWidth: Int, x0: Int, y0: Int, width: Int, height: Int) throws {
        guard (0...12).contains(bits) else { throw Refusal("LZW code size \(bits)") }
        let clear = 1 << bits, end = clear + 1
        var interlace = interlaced ? 1 : 0
        var step = interlaced ? 8 : 1
        var x = 0, y = 0
        var at = start, blockLeft = 0
        var bitBuffer = 0, bitCount = 0
        var next = clear + 2, codeSize = bits + 1, codeMask = (1 << (bits + 1)) - 1
        var first = true  // the state right after a clear code
        var lastCode = 0, lastData: UInt8 = 0
        var link = [Int](repeating: 0, count: 4096), table = [UInt8](repeating: 0, count: 4096)
        var stack = [UInt8](repeating: 0, count: 4096)

        /// Writes one pixel; true when the frame is complete.
        func put(_ value: UInt8) -> Bool {
            canvas[(y0 + y) * canvasWidth + x0 + x] = value
            x += 1
            guard x >= width else { return false }
            x = 0
            y += step
            while y >= height {
                switch interlace {
                case 1: (y, interlace) = (4, 2)
                case 2: (step, y, interlace) = (4, 2, 3)
                case 3: (step, y, interlace) = (2, 1, 0)
                default: return true
                }
            }
            return false
        }

        while true {
            while bitCount < codeSize {
                if blockLeft > 0 {
                    bitBuffer |= Int(data[at]) << bitCount
                    at += 1
                    blockLeft -= 1
                    bitCount += 8
                } else {
                    guard at < data.count, at + Int(data[at]) + 1 <= data.count else {
                        throw Refusal("image file is truncated")
                    }
                    blockLeft = Int(data[at])
                    at += 1
                }
            }
            var code = bitBuffer & codeMask
            bitBuffer >>= codeSize
            bitCount -= codeSize
            if code == clear {
                if !first { (next, codeSize, codeMask, first) = (clear + 2, bits + 1, (1 << (bits + 1)) - 1, true) }
                continue
            }
            // Pillow's decoder stops at the end code and asks for more data, which a file read whole does not have.
            if code == end { throw Refusal("image file is truncated (end code before the frame is complete)") }
            if first {
                guard code < clear else { throw Refusal("broken data stream") }
                lastData = UInt8(truncatingIfNeeded: code)
                lastCode = code
                first = false
                if put(lastData) { return }
                continue
            }
            let thisCode = code
            guard code <= next else { throw Refusal("broken data stream") }
            var depth = stack.count
            if code == next {
                stack[depth - 1] = lastData
                depth -= 1
                code = lastCode
            }
            while code >= clear {
                guard depth > 0, code < 4096 else { throw Refusal("broken data stream") }
                depth -= 1
                stack[depth] = table[code]
                code = link[code]
            }
            lastData = UInt8(truncatingIfNeeded: code)
            if next < 4096 {
                table[next] = lastData
                link[next] = lastCode
                if next == codeMask && codeSize < 12 {
                    codeSize += 1
                    codeMask = (1 << codeSize) - 1
                }
                next += 1
            }
            lastCode = thisCode
            if put(lastData) { return }
            for i in depth..<stack.count where put(stack[i]) { return }
        }
    }
}
