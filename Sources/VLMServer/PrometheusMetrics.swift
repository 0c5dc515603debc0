import CoreMetrics
import Foundation

/// A swift-metrics backend that keeps every metric in memory and writes them in Prometheus' text exposition format
/// (`GET /metrics`): counters as `counter`, meters as `gauge`, recorders and timers as `histogram` (timers in
/// seconds). One per server, passed to each metric as its factory, so that servers in one process keep apart.
public final class PrometheusMetrics: MetricsFactory, @unchecked Sendable {
    /// Upper bounds (seconds) of the latency histograms' buckets.
    static let secondsBuckets: [Double] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60]

    private let lock = NSLock()
    private var series: [SeriesKey: Series] = [:]

    public init() {}

    private struct SeriesKey: Hashable {
        let label: String
        let dimensions: [String]
    }

    private final class Series: CounterHandler, FloatingPointCounterHandler, MeterHandler, RecorderHandler, TimerHandler,
        @unchecked Sendable {
        enum Kind { case counter, gauge, histogram }
        let kind: Kind
        /// Timers record nanoseconds; they are shown in seconds.
        let scale: Double
        private let lock = NSLock()
        private(set) var value: Double = 0
        private(set) var buckets: [Int]
        private(set) var count = 0
        private(set) var sum: Double = 0

        init(kind: Kind, scale: Double = 1) {
            self.kind = kind
            self.scale = scale
            buckets = Array(repeating: 0, count: PrometheusMetrics.secondsBuckets.count)
        }

        func snapshot() -> (value: Double, buckets: [Int], count: Int, sum: Double) {
            lock.withLock { (value, buckets, count, sum) }
        }

        func increment(by amount: Int64) { lock.withLock { value += Double(amount) } }
        func increment(by amount: Double) { lock.withLock { value += amount } }
        func reset() { lock.withLock { value = 0 } }
        func set(_ value: Int64) { set(Double(value)) }
        func set(_ value: Double) {
            if kind == .gauge { lock.withLock { self.value = value } } else { observe(value) }
        }
        func decrement(by amount: Double) { lock.withLock { value -= amount } }
        func record(_ value: Int64) { observe(Double(value)) }
        func record(_ value: Double) { observe(value) }
        func recordNanoseconds(_ duration: Int64) { observe(Double(duration)) }

        private func observe(_ raw: Double) {
            let value = raw * scale
            lock.withLock {
                count += 1
                sum += value
                if let index = PrometheusMetrics.secondsBuckets.firstIndex(where: { value <= $0 }) { buckets[index] += 1 }
            }
        }
    }

    private func series(_ label: String, _ dimensions: [(String, String)], _ make: () -> Series) -> Series {
        let key = SeriesKey(label: label, dimensions: dimensions.flatMap { [$0.0, $0.1] })
        return lock.withLock {
            if let existing = series[key] { return existing }
            let created = make()
            series[key] = created
            return created
        }
    }

    public func makeCounter(label: String, dimensions: [(String, String)]) -> any CounterHandler {
        series(label, dimensions) { Series(kind: .counter) }
    }

    public func makeFloatingPointCounter(label: String, dimensions: [(String, String)]) -> any FloatingPointCounterHandler {
        series(label, dimensions) { Series(kind: .counter) }
    }

    public func makeMeter(label: String, dimensions: [(String, String)]) -> any MeterHandler {
        series(label, dimensions) { Series(kind: .gauge) }
    }

    public func makeRecorder(label: String, dimensions: [(String, String)], aggregate: Bool) -> any RecorderHandler {
        series(label, dimensions) { Series(kind: aggregate ? .histogram : .gauge) }
    }

    public func makeTimer(label: String, dimensions: [(String, String)]) -> any TimerHandler {
        series(label, dimensions) { Series(kind: .histogram, scale: 1e-9) }
    }

    public func destroyCounter(_ handler: any CounterHandler) {}
    public func destroyFloatingPointCounter(_ handler: any FloatingPointCounterHandler) {}
    public func destroyMeter(_ handler: any MeterHandler) {}
    public func destroyRecorder(_ handler: any RecorderHandler) {}
    public func destroyTimer(_ handler: any TimerHandler) {}

    /// Every series in the text exposition format, grouped by metric name.
    public func exposition() -> String {
        let all = lock.withLock { series.sorted { ($0.key.label, $0.key.dimensions.joined()) < ($1.key.label, $1.key.dimensions.joined()) } }
        var text = ""
        var typed = Set<String>()
        for (key, item) in all {
            let name = key.label.map { $0.isLetter || $0.isNumber || $0 == "_" ? $0 : "_" }.reduce(into: "") { $0.append($1) }
            if typed.insert(name).inserted {
                let type = switch item.kind {
                case .counter: "counter"
                case .gauge: "gauge"
                case .histogram: "histogram"
                }
                text += "# TYPE \(name) \(type)\n"
            }
            let pairs = stride(from: 0, to: key.dimensions.count, by: 2).map { (key.dimensions[$0], key.dimensions[$0 + 1]) }
            func labels(_ extra: [(String, String)] = []) -> String {
                let all = pairs + extra
                guard !all.isEmpty else { return "" }
                return "{" + all.map { "\($0.0)=\"\(escaped($0.1))\"" }.joined(separator: ",") + "}"
            }
            let snapshot = item.snapshot()
            switch item.kind {
            case .counter, .gauge:
                text += "\(name)\(labels()) \(formatted(snapshot.value))\n"
            case .histogram:
                var cumulative = 0
                for (bound, count) in zip(Self.secondsBuckets, snapshot.buckets) {
                    cumulative += count
                    text += "\(name)_bucket\(labels([("le", formatted(bound))])) \(cumulative)\n"
                }
                text += "\(name)_bucket\(labels([("le", "+Inf")])) \(snapshot.count)\n"
                text += "\(name)_sum\(labels()) \(formatted(snapshot.sum))\n"
                text += "\(name)_count\(labels()) \(snapshot.count)\n"
            }
        }
        return text
    }

    private func escaped(_ value: String) -> String {
        value.replacingOccurrences(of: "\\", with: "\\\\").replacingOccurrences(of: "\"", with: "\\\"")
            .replacingOccurrences(of: "\n", with: "\\n")
    }

    private func formatted(_ value: Double) -> String {
        value == value.rounded() && abs(value) < 1e15 ? String(Int64(value)) : "\(value)"
    }
}
