#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
import Foundation
import VLMTensor

extension SafetensorsFile {
    /// Writes `tensors` as a safetensors file of F32 tensors, as `safetensors.torch.save_file` lays one out: an
    /// 8-byte little-endian header length, the JSON header (`__metadata__` `{"format": "pt"}`, then each tensor's
    /// dtype, shape and byte offsets) padded with spaces to a multiple of 8, then the tensors' bytes in name order.
    /// The file appears whole or not at all: it is written beside `url` and renamed over it.
    public static func write(_ tensors: [String: Tensor], to url: URL) throws {
        try write(shapes: tensors.mapValues(\.shape), to: url) { tensors[$0]! }
    }

    /// ``write(_:to:)`` for tensors of the given shapes that `tensor` produces one at a time, each written and let go
    /// before the next is asked for: a whole checkpoint written without holding all of it in memory.
    public static func write(shapes: [String: [Int]], to url: URL, reading tensor: (String) throws -> Tensor) throws {
        let names = shapes.keys.sorted()
        var entries: [String] = [#""__metadata__":{"format":"pt"}"#]
        var offset = 0
        for name in names {
            let size = Tensor.elementCount(shapes[name]!) * MemoryLayout<Float>.stride
            let shape = shapes[name]!.map(String.init).joined(separator: ",")
            entries.append("\(jsonString(name)):{\"dtype\":\"F32\",\"shape\":[\(shape)],\"data_offsets\":[\(offset),\(offset + size)]}")
            offset += size
        }
        var header = Array(("{" + entries.joined(separator: ",") + "}").utf8)
        header += [UInt8](repeating: 0x20, count: (8 - header.count % 8) % 8)
        // Written beside the destination and renamed over it; tensors go out straight from their storage (fp32 in
        // memory is safetensors' little-endian F32 on every platform this builds for).
        let partial = url.deletingLastPathComponent().appendingPathComponent(".\(url.lastPathComponent).partial")
        do {
            guard FileManager.default.createFile(atPath: partial.path, contents: nil) else {
                throw CocoaError(.fileWriteUnknown)
            }
            let file = try FileHandle(forWritingTo: partial)
            defer { try? file.close() }
            try file.write(contentsOf: withUnsafeBytes(of: UInt64(header.count).littleEndian) { Data($0) })
            try file.write(contentsOf: Data(header))
            for name in names {
                let tensor = try tensor(name)
                precondition(tensor.shape == shapes[name]!, "\(name): a tensor of \(tensor.shape) for a header entry of \(shapes[name]!)")
                try file.write(contentsOf: Data(bytesNoCopy: tensor.storage.pointer, count: tensor.count * MemoryLayout<Float>.stride,
                                                deallocator: .none))
            }
            try file.close()
            guard rename(partial.path, url.path) == 0 else { throw POSIXError(POSIXErrorCode(rawValue: errno) ?? .EIO) }
        } catch {
            try? FileManager.default.removeItem(at: partial)
            throw CheckpointError.unwritable(path: url.path, reason: error.localizedDescription)
        }
    }

    /// `text` as a JSON string literal.
    private static func jsonString(_ text: String) -> String {
        var out = "\""
        for scalar in text.unicodeScalars {
            switch scalar {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case _ where scalar.value < 0x20: out += String(format: "\\u%04x", scalar.value)
            default: out.unicodeScalars.append(scalar)
            }
        }
        return out + "\""
    }
}
