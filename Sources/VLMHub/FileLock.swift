import Foundation

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// An exclusive `flock` on `.locks/models--org--name/<etag>.lock`, the lock huggingface_hub's `filelock` takes, so
/// Python and SwiftVLM processes never write the same blob at once. Polled without blocking so that waiting does not
/// hold a thread of Swift's cooperative pool.
final class FileLock: @unchecked Sendable {
    private let descriptor: Int32

    private init(descriptor: Int32) { self.descriptor = descriptor }

    static func acquire(_ url: URL, timeout: TimeInterval) async throws -> FileLock {
        try createDirectory(url.deletingLastPathComponent())
        let descriptor = open(url.path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0o664)
        guard descriptor >= 0 else { throw posixError(url.path) }
        let deadline = Date().addingTimeInterval(timeout)
        while flock(descriptor, LOCK_EX | LOCK_NB) != 0 {
            guard errno == EWOULDBLOCK || errno == EINTR else {
                let error = posixError(url.path)
                close(descriptor)
                throw error
            }
            guard Date() < deadline else {
                close(descriptor)
                throw HubError.lockTimeout(path: url.path, seconds: timeout)
            }
            do {
                try await Task.sleep(for: .milliseconds(50))
            } catch {
                close(descriptor)
                throw error
            }
        }
        return FileLock(descriptor: descriptor)
    }

    /// Closing the descriptor releases the lock; the file stays, as with huggingface_hub.
    deinit {
        close(descriptor)
    }
}
