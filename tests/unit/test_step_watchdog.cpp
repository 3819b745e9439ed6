// The step watchdog's logic, with probes that are plain flags (no GPU, no NCCL): a step that
// finishes is left alone however long the job then idles; one that does not is reported once,
// within its timeout and a poll, naming the step and what it was doing; an asynchronous error is
// reported even between steps.

#include <capscope/parallel/step_watchdog.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>

using namespace std::chrono_literals;
using capscope::step_watchdog;
using capscope::watchdog_fault;
using capscope::watchdog_settings;

namespace {

//! Flags the probes read, and what the handler saw.
struct world {
    std::atomic<bool> finished{false};
    std::mutex m;
    std::string error; // the async error the probe reports (empty: none)
    std::atomic<int> faults{0};
    watchdog_fault last;
    std::chrono::steady_clock::time_point fired_at{};

    step_watchdog::probes probes() {
        return {[this] {
                    std::lock_guard lock(m);
                    return error;
                },
                [this] { return finished.load(); }};
    }
    step_watchdog::fault_handler handler() {
        return [this](const watchdog_fault& f) {
            {
                std::lock_guard lock(m);
                last = f;
                fired_at = std::chrono::steady_clock::now();
            }
            ++faults;
        };
    }
    //! Waits up to `limit` for a fault; true when one came.
    bool wait_fault(std::chrono::milliseconds limit) {
        const auto end = std::chrono::steady_clock::now() + limit;
        while (faults.load() == 0 && std::chrono::steady_clock::now() < end) std::this_thread::sleep_for(2ms);
        return faults.load() > 0;
    }
};

watchdog_settings fast(std::chrono::milliseconds step, std::chrono::milliseconds warmup = 5000ms) {
    watchdog_settings s;
    s.step_timeout = step;
    s.warmup_timeout = warmup;
    s.poll = 5ms;
    return s;
}

} // namespace

TEST_CASE("step watchdog: steps that finish are left alone, and so is a job that idles between steps") {
    world w;
    step_watchdog dog(w.probes(), w.handler(), fast(300ms)); // far above a step here, even on a loaded machine
    for (int step = 0; step < 5; ++step) {
        w.finished = false;
        dog.begin_step(true);
        std::this_thread::sleep_for(10ms); // enqueueing
        dog.end_enqueue();
        std::this_thread::sleep_for(10ms); // the device works
        w.finished = true;
    }
    std::this_thread::sleep_for(700ms); // idle for two timeouts: nothing is armed
    CHECK(w.faults.load() == 0);
    CHECK_FALSE(dog.fired());
    CHECK(dog.steps() == 5);
}

TEST_CASE("step watchdog: a step whose work never finishes is reported once, within its timeout and a poll") {
    world w;
    step_watchdog dog(w.probes(), w.handler(), fast(100ms));
    const auto armed = std::chrono::steady_clock::now(); // before begin_step: a lower bound that holds
    dog.begin_step(true);
    dog.end_enqueue();
    REQUIRE(w.wait_fault(3000ms));
    const auto after = std::chrono::duration_cast<std::chrono::milliseconds>(w.fired_at - armed);
    CHECK(after >= 100ms);
    CHECK(after < 1500ms); // the timeout and a poll, with room for a loaded CI machine
    std::this_thread::sleep_for(50ms);
    CHECK(w.faults.load() == 1); // once
    CHECK(dog.fired());
    std::lock_guard lock(w.m);
    CHECK(w.last.step == 1);
    CHECK(w.last.what.find("step 1 did not finish within 100 ms (watchdog_settings::step_timeout)") != std::string::npos);
    CHECK(w.last.what.find("its work was enqueued and the device has not finished it") != std::string::npos);
    CHECK(w.last.what.find("-- fix:") != std::string::npos);
}

TEST_CASE("step watchdog: a host stuck while enqueueing is reported as such") {
    world w;
    step_watchdog dog(w.probes(), w.handler(), fast(50ms));
    dog.begin_step(true); // and never end_enqueue: the host is blocked
    REQUIRE(w.wait_fault(3000ms));
    std::lock_guard lock(w.m);
    CHECK(w.last.what.find("the host was still enqueueing it") != std::string::npos);
}

TEST_CASE("step watchdog: a step that may capture gets the warmup timeout") {
    world w;
    step_watchdog dog(w.probes(), w.handler(), fast(40ms, 1000ms));
    dog.begin_step(false);
    dog.end_enqueue();
    std::this_thread::sleep_for(200ms); // past the step timeout, within the warmup one
    CHECK(w.faults.load() == 0);
    REQUIRE(w.wait_fault(3000ms));
    std::lock_guard lock(w.m);
    CHECK(w.last.what.find("did not finish within 1000 ms (watchdog_settings::warmup_timeout") != std::string::npos);
}

TEST_CASE("step watchdog: an asynchronous error is reported between steps too, with no step") {
    world w;
    step_watchdog dog(w.probes(), w.handler(), fast(5000ms));
    dog.begin_step(true);
    dog.end_enqueue();
    w.finished = true;
    const auto end = std::chrono::steady_clock::now() + 3000ms;
    while (dog.armed() && std::chrono::steady_clock::now() < end) std::this_thread::sleep_for(2ms); // the step is seen finished
    REQUIRE_FALSE(dog.armed());
    {
        std::lock_guard lock(w.m);
        w.error = "NCCL reports an asynchronous error: remote process exited or there was a network error";
    }
    REQUIRE(w.wait_fault(3000ms));
    std::lock_guard lock(w.m);
    CHECK(w.last.step == 0);
    CHECK(w.last.what.find("remote process exited") != std::string::npos);
}

TEST_CASE("step watchdog: bad settings are refused, and it stops at once when destroyed") {
    world w;
    watchdog_settings zero;
    zero.step_timeout = 0ms;
    CHECK_THROWS_WITH_AS(step_watchdog(w.probes(), w.handler(), zero), "step_watchdog: the timeouts and the poll interval must be positive",
                         std::invalid_argument);
    watchdog_settings no_abort_time;
    no_abort_time.abort_timeout = 0ms;
    CHECK_THROWS_AS(step_watchdog(w.probes(), w.handler(), no_abort_time), std::invalid_argument);
    CHECK_THROWS_AS(step_watchdog(w.probes(), {}, {}), std::invalid_argument);
    watchdog_settings slow;
    slow.poll = 60'000ms; // a destructor must not wait for the next poll
    const auto t0 = std::chrono::steady_clock::now();
    { step_watchdog dog(w.probes(), w.handler(), slow); }
    CHECK(std::chrono::steady_clock::now() - t0 < 2000ms);
}
