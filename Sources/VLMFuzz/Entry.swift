import Foundation

// Built for fuzzing (scripts/fuzz: -sanitize=fuzzer and FUZZING), main hands over to libFuzzer's driver, which calls
// the two functions below; built plainly, `vlm-fuzz TARGET FILE...` runs saved inputs through the same code, which
// is how a finding is replayed and checked fixed.

nonisolated(unsafe) private var selected: FuzzTarget?
nonisolated(unsafe) private var workspace: FuzzWorkspace?

private func fail(_ message: String) -> Never {
    FileHandle.standardError.write(Data("vlm-fuzz: \(message)\n".utf8))
    exit(2)
}

private func fixturesDirectory() -> URL {
    URL(fileURLWithPath: ProcessInfo.processInfo.environment["VLM_FUZZ_FIXTURES"] ?? "Tests/Fixtures")
}

@_cdecl("LLVMFuzzerInitialize")
public func fuzzerInitialize(_ argc: UnsafeMutablePointer<Int32>, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?>) -> Int32 {
    let name = ProcessInfo.processInfo.environment["VLM_FUZZ_TARGET"] ?? ""
    guard let target = FuzzTarget(rawValue: name) else {
        fail("set VLM_FUZZ_TARGET to one of: \(FuzzTarget.allCases.map(\.rawValue).joined(separator: ", "))")
    }
    selected = target
    do {
        workspace = try FuzzWorkspace(fixtures: fixturesDirectory())
        try workspace!.prepare(for: target)
    } catch {
        fail("\(error)")
    }
    return 0
}

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzerTestOneInput(_ data: UnsafePointer<UInt8>?, _ size: Int) -> Int32 {
    let bytes = data.map { Array(UnsafeBufferPointer(start: $0, count: size)) } ?? []
    selected!.run(bytes, in: workspace!)
    return 0
}

#if FUZZING
@_silgen_name("LLVMFuzzerRunDriver")
private func runFuzzerDriver(
    _ argc: UnsafeMutablePointer<Int32>,
    _ argv: UnsafeMutablePointer<UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?>,
    _ testOneInput: @convention(c) (UnsafePointer<UInt8>?, Int) -> Int32) -> Int32
#endif

@main
struct FuzzMain {
    static func main() throws {
        #if FUZZING
        var argc = CommandLine.argc
        var argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>? = CommandLine.unsafeArgv
        exit(runFuzzerDriver(&argc, &argv, fuzzerTestOneInput))
        #else
        try replay()
        #endif
    }

    static func replay() throws {
        let arguments = CommandLine.arguments.dropFirst()
        guard let name = arguments.first, let target = FuzzTarget(rawValue: name), arguments.count > 1 else {
            fail("usage: vlm-fuzz TARGET FILE|DIR...  (targets: \(FuzzTarget.allCases.map(\.rawValue).joined(separator: ", ")))")
        }
        let workspace = try FuzzWorkspace(fixtures: fixturesDirectory())
        for path in arguments.dropFirst() {
            var isDirectory: ObjCBool = false
            _ = FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory)
            let files = isDirectory.boolValue ? Self.files(under: path) : [path]
            for file in files {
                let error = target.run(try [UInt8](Data(contentsOf: URL(fileURLWithPath: file))), in: workspace)
                print("\(file): \(error.map { "refused: \($0)" } ?? "ok")")
            }
        }
    }

    /// The regular files under `directory`, at any depth, in path order.
    static func files(under directory: String) -> [String] {
        let root = URL(fileURLWithPath: directory)
        let entries = FileManager.default.enumerator(at: root, includingPropertiesForKeys: [.isRegularFileKey])?
            .compactMap { $0 as? URL } ?? []
        return entries.filter { (try? $0.resourceValues(forKeys: [.isRegularFileKey]).isRegularFile) == true }
            .map(\.path).sorted()
    }
}
