import Foundation

/// Draws download progress on one terminal line: `[#####-----]  45% 120.5 MB / 267.8 MB  12.3 MB/s  0:12 left  3/8
/// files`, redrawn in place with `\r` at most ten times a second. The caller decides whether to use it (stdout a
/// TTY, no `--quiet`); pass ``update(_:)`` as the ``HubProgressHandler``.
public final class TerminalProgressBar: @unchecked Sendable {
    private let lock = NSLock()
    private let output: FileHandle
    private let width: Int
    private let clock: @Sendable () -> Date
    private var files: [String: HubProgress] = [:]
    private var startTime: Date?
    private var startBytes: Int64 = 0
    private var lastDraw = Date.distantPast
    private var lastLength = 0

    /// - Parameters:
    ///   - output: where to draw; standard error by default, so stdout stays clean for results.
    ///   - width: the bar's width in characters.
    public init(output: FileHandle = .standardError, width: Int = 30) {
        self.output = output
        self.width = width
        clock = { Date() }
    }

    init(output: FileHandle, width: Int, clock: @escaping @Sendable () -> Date) {
        self.output = output
        self.width = width
        self.clock = clock
    }

    /// Records one report and redraws when the last draw is older than 0.1 s or a file finished.
    public func update(_ progress: HubProgress) {
        let line: String? = lock.withLock {
            let now = clock()
            if startTime == nil {
                startTime = now
                startBytes = progress.completedBytes
            }
            files[progress.file] = progress
            guard progress.isFinished || now.timeIntervalSince(lastDraw) >= 0.1 else { return nil }
            lastDraw = now
            return render(now: now)
        }
        if let line { draw(line) }
    }

    /// Draws the final state and ends the line.
    public func finish() {
        let line = lock.withLock { render(now: clock()) }
        draw(line + "\n")
    }

    /// The line for the current state.
    func render(now: Date) -> String {
        let done = files.values.reduce(Int64(0)) { $0 + $1.completedBytes }
        let total = files.values.reduce(Int64(0)) { $0 + ($1.totalBytes ?? $1.completedBytes) }
        let finished = files.values.filter(\.isFinished).count
        let elapsed = startTime.map { now.timeIntervalSince($0) } ?? 0
        let speed = elapsed > 0.2 ? Double(done - startBytes) / elapsed : nil
        return Self.format(done: done, total: total, bytesPerSecond: speed, width: width)
            + "  \(finished)/\(files.count) files"
    }

    /// `[####------]  40% 4.0 kB / 10.0 kB  1.0 kB/s  0:06 left`; speed and time left only once known.
    static func format(done: Int64, total: Int64, bytesPerSecond: Double?, width: Int) -> String {
        let fraction = total > 0 ? min(1, Double(done) / Double(total)) : 0
        let filled = Int((fraction * Double(width)).rounded(.down))
        var line = "[" + String(repeating: "#", count: filled) + String(repeating: "-", count: width - filled) + "]"
        line += " " + String(repeating: " ", count: max(0, 3 - String(Int(fraction * 100)).count))
            + "\(Int(fraction * 100))% \(formatBytes(done)) / \(formatBytes(total))"
        if let bytesPerSecond, bytesPerSecond > 0 {
            line += "  \(formatBytes(Int64(bytesPerSecond)))/s"
            if total > done {
                line += "  \(formatDuration(Double(total - done) / bytesPerSecond)) left"
            }
        }
        return line
    }

    /// Decimal units, as the Hub shows sizes: `999 B`, `1.5 kB`, `267.8 MB`, `3.1 GB`.
    static func formatBytes(_ bytes: Int64) -> String {
        if bytes < 1000 { return "\(bytes) B" }
        let units = ["kB", "MB", "GB", "TB"]
        var value = Double(bytes) / 1000
        var unit = 0
        while value >= 999.95, unit < units.count - 1 {
            value /= 1000
            unit += 1
        }
        return String(format: "%.1f %@", value, units[unit])
    }

    /// `m:ss`, or `h:mm:ss` from an hour on.
    static func formatDuration(_ seconds: Double) -> String {
        let total = Int(min(seconds, 359_999).rounded(.up))
        let (hours, minutes, secs) = (total / 3600, total / 60 % 60, total % 60)
        let twoDigits = { (value: Int) in value < 10 ? "0\(value)" : "\(value)" }
        return hours > 0 ? "\(hours):\(twoDigits(minutes)):\(twoDigits(secs))" : "\(minutes):\(twoDigits(secs))"
    }

    private func draw(_ line: String) {
        let (text, padding): (String, Int) = lock.withLock {
            let visible = line.trimmingCharacters(in: .newlines)
            defer { lastLength = line.hasSuffix("\n") ? 0 : visible.count }
            return (visible, max(0, lastLength - visible.count))
        }
        let ending = line.hasSuffix("\n") ? "\n" : ""
        output.write(Data(("\r" + text + String(repeating: " ", count: padding) + ending).utf8))
    }
}
