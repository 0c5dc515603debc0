extension Tensor {
    /// The tensor as a NumPy `.npy` file, format version 1.0: float32 little-endian, C order, its shape; byte for
    /// byte what `numpy.save` writes for the same array (the header padded with spaces to a 64-byte boundary, with
    /// the spare room NumPy leaves for the first axis to grow).
    public var npyBytes: [UInt8] {
        let shapeText = switch shape.count {
        case 0: "()"
        case 1: "(\(shape[0]),)"
        default: "(" + shape.map(String.init).joined(separator: ", ") + ")"
        }
        var header = "{'descr': '<f4', 'fortran_order': False, 'shape': \(shapeText), }"
        // numpy.lib.format's GROWTH_AXIS_MAX_DIGITS (21) less the digits of the first axis.
        if let first = shape.first { header += String(repeating: " ", count: max(0, 21 - String(first).count)) }
        let prefix = 10  // magic, version, header length
        let unpadded = header.utf8.count + 1
        let padding = 64 - (prefix + unpadded) % 64
        let headerLength = unpadded + padding
        precondition(headerLength <= Int(UInt16.max), "npy header of \(headerLength) bytes is too long for format 1.0")
        var bytes: [UInt8] = [0x93] + Array("NUMPY".utf8) + [1, 0, UInt8(headerLength & 0xFF), UInt8(headerLength >> 8)]
        bytes.reserveCapacity(prefix + headerLength + count * 4)
        bytes += Array(header.utf8) + [UInt8](repeating: 0x20, count: padding) + [0x0A]
        withUnsafeBufferPointer { values in
            for value in values {
                let bits = value.bitPattern.littleEndian
                withUnsafeBytes(of: bits) { bytes.append(contentsOf: $0) }
            }
        }
        return bytes
    }
}
