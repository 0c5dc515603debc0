#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// A regular file mapped read-only for as long as this object lives. Immutable, hence safe to share across threads.
final class MappedFile: @unchecked Sendable {
    let bytes: UnsafeRawBufferPointer

    /// Files shorter than `minimumSize` get `tooShort(size)`, which also keeps mmap from seeing zero bytes.
    init(path: String, minimumSize: Int, tooShort: (Int) -> CheckpointError) throws {
        let (start, size) = try mapReadOnly(path, minimumSize: minimumSize, tooShort: tooShort)
        bytes = UnsafeRawBufferPointer(start: start, count: size)
    }

    /// Gives back the pages under `range`, to be read from the file again if touched. A tensor copied out of the map
    /// leaves its pages resident in this process until the map goes; a checkpoint read whole into packed layers would
    /// then count twice against memory. Pages shared with a neighbouring tensor are only faulted in again.
    func releasePages(_ range: Range<Int>) {
        let page = Int(sysconf(Int32(_SC_PAGESIZE)))
        let start = range.lowerBound / page * page
        let end = min(bytes.count, (range.upperBound + page - 1) / page * page)
        guard end > start else { return }
        madvise(UnsafeMutableRawPointer(mutating: bytes.baseAddress! + start), end - start, MADV_DONTNEED)
    }

    deinit {
        munmap(UnsafeMutableRawPointer(mutating: bytes.baseAddress!), bytes.count)
    }
}

private func mapReadOnly(_ path: String, minimumSize: Int, tooShort: (Int) -> CheckpointError) throws -> (UnsafeRawPointer, Int) {
    let descriptor = open(path, O_RDONLY | O_CLOEXEC)
    guard descriptor >= 0 else {
        let code = errno
        if code == ENOENT { throw CheckpointError.missingFile(path: path) }
        throw CheckpointError.unreadable(file: path, reason: String(cString: strerror(code)))
    }
    defer { close(descriptor) }
    var status = stat()
    guard fstat(descriptor, &status) == 0 else {
        throw CheckpointError.unreadable(file: path, reason: String(cString: strerror(errno)))
    }
    guard (status.st_mode & S_IFMT) == S_IFREG else {
        throw CheckpointError.unreadable(file: path, reason: "not a regular file")
    }
    let size = Int(status.st_size)
    guard size >= max(minimumSize, 1) else { throw tooShort(size) }
    guard let mapping = mmap(nil, size, PROT_READ, MAP_PRIVATE, descriptor, 0),
          mapping != UnsafeMutableRawPointer(bitPattern: -1)
    else {
        throw CheckpointError.unreadable(file: path, reason: "mmap: \(String(cString: strerror(errno)))")
    }
    return (UnsafeRawPointer(mapping), size)
}
