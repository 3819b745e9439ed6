#pragma once
//! @file
//! `capture_failed`: capturing a segment went wrong at run time (a stage synchronized,
//! allocated or called an API capture forbids, without saying so in its tags). By the time it
//! is thrown the capture has ended, the partial graph is destroyed and the stream is usable.

#include <stdexcept>
#include <string>

namespace capscope {

class capture_failed : public std::runtime_error {
public:
    capture_failed(const std::string& what, std::string stage, int layer, int graph, int microbatch)
        : std::runtime_error(what), what_(what), stage_(std::move(stage)), layer_(layer), graph_(graph), microbatch_(microbatch) {}
    const char* what() const noexcept override { return what_.c_str(); }
    //! How much of the training step had run when the capture failed (a lazily captured step
    //! fails in its middle): "" when the runner did not say.
    const std::string& step_progress() const noexcept { return progress_; }
    //! Called by the runner: records the progress and adds it to the message.
    void set_step_progress(std::string progress) {
        progress_ = std::move(progress);
        what_ += "\n  " + progress_;
    }
    //! The stage that was running when the capture failed ("" if the failure showed only when
    //! the capture ended; the message then lists the segment's stages).
    const std::string& stage() const noexcept { return stage_; }
    int layer() const noexcept { return layer_; }           //!< -1 outside the layers
    int graph() const noexcept { return graph_; }           //!< the plan's graph number
    int microbatch() const noexcept { return microbatch_; } //!< -1 for step-level work

private:
    std::string what_, progress_;
    std::string stage_;
    int layer_, graph_, microbatch_;
};

} // namespace capscope
