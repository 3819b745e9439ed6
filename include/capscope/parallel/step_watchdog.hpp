#pragma once
//! @file
//! A watchdog over training steps: a thread that ends a step which cannot finish. On several GPUs
//! a rank whose peer stopped taking part (stuck, or gone without its process ending) waits in a
//! collective for ever, and so does its host at the next synchronization. The watchdog gives each
//! step a deadline, and polls a probe for asynchronous errors (NCCL's), between steps too. When
//! either fires, it calls the fault handler once, on its own thread; that handler ends the job
//! (parallel/nccl_watchdog.hpp ends the process). A handler must not throw (that terminates) and
//! should not block: the destructor joins the thread.
//!
//! A step's deadline counts from its begin_step, and its end is an event after its work, which
//! also waits for earlier steps still queued: a host that runs ahead of the device by k steps
//! needs a step timeout above k steps' time.
//!
//! Host only: the probes are functions, so the logic is tested without a GPU.

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>

namespace capscope {

struct watchdog_settings {
    //! A steady step: one after a step that captured nothing. It must finish within this.
    std::chrono::milliseconds step_timeout{10'000};
    //! A step that may warm up or capture graphs (the first steps), which takes longer.
    std::chrono::milliseconds warmup_timeout{300'000};
    //! How often the probes are asked.
    std::chrono::milliseconds poll{20};
    //! With a fault handler: how long the communicators' aborts may take before the handler runs
    //! anyway (nccl_watchdog). Positive: an unbounded wait could keep the handler from running.
    std::chrono::milliseconds abort_timeout{5'000};
};

//! What the watchdog found: the step (counted from 1, 0 between steps), and what went wrong.
struct watchdog_fault {
    long step = 0;
    std::string what;
};

class step_watchdog {
public:
    struct probes {
        //! Empty, or the text of an asynchronous error (polled at every tick, also between steps).
        std::function<std::string()> async_error;
        //! Whether the work of the step whose enqueue ended has finished (polled while one is armed).
        std::function<bool()> step_finished;
    };
    using fault_handler = std::function<void(const watchdog_fault&)>;

    step_watchdog(probes p, fault_handler on_fault, watchdog_settings settings = {})
        : probes_(std::move(p)), on_fault_(std::move(on_fault)), settings_(settings) {
        if (!probes_.async_error || !probes_.step_finished || !on_fault_)
            throw std::invalid_argument("step_watchdog: both probes and the fault handler must be set");
        if (settings_.step_timeout <= std::chrono::milliseconds(0) || settings_.warmup_timeout <= std::chrono::milliseconds(0) ||
            settings_.poll <= std::chrono::milliseconds(0) || settings_.abort_timeout <= std::chrono::milliseconds(0))
            throw std::invalid_argument("step_watchdog: the timeouts and the poll interval must be positive");
        thread_ = std::thread([this] { watch(); });
    }
    ~step_watchdog() {
        {
            std::lock_guard lock(mutex_);
            stop_ = true;
        }
        wake_.notify_all();
        thread_.join();
    }
    step_watchdog(const step_watchdog&) = delete;
    step_watchdog& operator=(const step_watchdog&) = delete;

    //! A step begins: from now it has the steady or the warmup timeout to finish.
    void begin_step(bool steady) {
        std::lock_guard lock(mutex_);
        ++step_;
        armed_ = true;
        enqueued_ = false;
        steady_ = steady;
        deadline_ = clock::now() + (steady ? settings_.step_timeout : settings_.warmup_timeout);
    }
    //! The host has enqueued the step's work: from now `step_finished` tells when it is done.
    void end_enqueue() {
        std::lock_guard lock(mutex_);
        enqueued_ = true;
    }
    //! The step ended on the host's side and was seen finished (e.g. the host synchronized):
    //! nothing to watch until the next begin_step.
    void disarm() {
        std::lock_guard lock(mutex_);
        armed_ = false;
    }
    //! A step is being watched (begun, and not yet seen finished or disarmed).
    bool armed() const {
        std::lock_guard lock(mutex_);
        return armed_;
    }
    bool fired() const {
        std::lock_guard lock(mutex_);
        return fired_;
    }
    long steps() const {
        std::lock_guard lock(mutex_);
        return step_;
    }

private:
    using clock = std::chrono::steady_clock;

    void watch() {
        std::unique_lock lock(mutex_);
        while (!stop_ && !fired_) {
            wake_.wait_for(lock, settings_.poll, [this] { return stop_; });
            if (stop_) break;
            // The probes are cheap, non-blocking queries; asking them under the lock keeps a
            // probe from seeing a step half begun.
            std::string error = probes_.async_error();
            if (error.empty() && armed_) {
                if (enqueued_ && probes_.step_finished()) armed_ = false;
                else if (clock::now() >= deadline_) error = timeout_text();
            }
            if (error.empty()) continue;
            fired_ = true;
            const watchdog_fault fault{armed_ ? step_ : 0, std::move(error)};
            lock.unlock(); // the handler may take long (an abort), and never needs the lock
            on_fault_(fault);
            return;
        }
    }
    std::string timeout_text() const {
        const long ms = static_cast<long>((steady_ ? settings_.step_timeout : settings_.warmup_timeout).count());
        return std::string("step ") + std::to_string(step_) + " did not finish within " + std::to_string(ms) + " ms (" +
               (steady_ ? "watchdog_settings::step_timeout" : "watchdog_settings::warmup_timeout, a step that may capture") + "); " +
               (enqueued_ ? "its work was enqueued and the device has not finished it: most likely a collective waits for a rank that "
                            "stopped taking part"
                          : "the host was still enqueueing it: blocked in a synchronization or a collective") +
               " -- fix: find the rank that stopped (its own error comes first), or raise the timeout if the step is that slow";
    }

    probes probes_;
    fault_handler on_fault_;
    watchdog_settings settings_;
    mutable std::mutex mutex_;
    std::condition_variable wake_;
    bool stop_ = false, fired_ = false, armed_ = false, enqueued_ = false, steady_ = false;
    long step_ = 0;
    clock::time_point deadline_{};
    std::thread thread_; // last: it starts after every member it reads
};

} // namespace capscope
