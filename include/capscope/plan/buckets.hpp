#pragma once
//! @file
//! Buckets (pure host): a fixed, ascending list of sizes, one graph per size. A request of n
//! rows runs in the smallest bucket >= n, padded with n..size-1 masked rows; a request past the
//! largest bucket is an error that names both sizes (rule P6), or runs eagerly unpadded when
//! the configuration says so (`oversize_requests<oversize::run_eagerly>`).
//!
//! The same list serves batch sizes (sequences per request) and, for a variable-length
//! encoder, padded lengths (patches per sample: `choose_length_bucket`, rule P7).

#include <capscope/vocabulary/buckets.hpp>

#include <cstddef>
#include <span>
#include <stdexcept>
#include <string>

namespace capscope {

//! Where a request runs: bucket `index` of size `size`, with `size - requested` padded rows;
//! or eagerly at its own size (`index == -1`) when it was past the largest and the policy allows.
struct bucket_choice {
    int index = -1;
    int size = 0;
    int requested = 0;

    constexpr bool eager() const { return index < 0; }
    constexpr int padded() const { return size - requested; }
    //! Whether row `r` of the padded batch holds a real request (the mask a model applies).
    constexpr bool real_row(int r) const { return r >= 0 && r < requested; }
    friend constexpr bool operator==(const bucket_choice&, const bucket_choice&) = default;
};

//! A request past the largest bucket (rule P6), or a sample past the largest length bucket (P7).
class bucket_overflow : public std::out_of_range {
public:
    bucket_overflow(std::string rule, const std::string& message, int requested, int largest)
        : std::out_of_range(message), rule_(std::move(rule)), requested_(requested), largest_(largest) {}
    const std::string& rule() const noexcept { return rule_; }
    int requested() const noexcept { return requested_; }
    int largest() const noexcept { return largest_; }

private:
    std::string rule_;
    int requested_, largest_;
};

namespace detail {
inline std::string bucket_text(const bucket_list& b) {
    std::string s;
    for (int v : b.view()) s += (s.empty() ? "" : ", ") + std::to_string(v);
    return "{" + s + "}";
}
} // namespace detail

//! The smallest bucket >= `n` (binary search; no allocation). Throws `std::invalid_argument` for
//! n < 1 and `bucket_overflow` (P6) past the largest unless `policy` is `run_eagerly`.
inline bucket_choice choose_bucket(const bucket_list& buckets, int n, oversize policy = oversize::raise) {
    if (n < 1) throw std::invalid_argument("capscope: a request needs at least one row, got " + std::to_string(n));
    int lo = 0, hi = buckets.count;
    while (lo < hi) {
        const int mid = (lo + hi) / 2;
        if (buckets[mid] < n) lo = mid + 1;
        else hi = mid;
    }
    if (lo < buckets.count) return {lo, buckets[lo], n};
    if (policy == oversize::run_eagerly) return {-1, n, n};
    throw bucket_overflow("P6",
                          "capscope plan rule P6: a request of " + std::to_string(n) + " rows is larger than the largest bucket, " +
                              std::to_string(buckets.largest()) + " (buckets " + detail::bucket_text(buckets) +
                              ") -- fix: add a bucket of at least " + std::to_string(n) +
                              ", split the request, or build the runner with oversize_requests<oversize::run_eagerly>",
                          n, buckets.largest());
}

//! The padding of a batch of variable-length samples: every sample is padded to one length, the
//! smallest length bucket >= the longest sample; `valid[i]` real positions of sample i.
struct length_padding {
    bucket_choice bucket; //!< `requested` is the longest sample
    int samples = 0;
    constexpr int padded_positions(std::span<const int> lengths) const {
        int p = 0;
        for (int l : lengths) p += bucket.size - l;
        return p;
    }
};

//! Picks the length bucket for a batch of samples. Throws `std::invalid_argument` for an empty
//! batch or a sample shorter than 1, and `bucket_overflow` (P7) naming the first sample past the
//! largest bucket, its length and that bucket.
inline length_padding choose_length_bucket(const bucket_list& lengths_buckets, std::span<const int> lengths) {
    if (lengths.empty()) throw std::invalid_argument("capscope: a batch needs at least one sample");
    int longest = 0;
    for (std::size_t i = 0; i < lengths.size(); ++i) {
        if (lengths[i] < 1)
            throw std::invalid_argument("capscope: sample " + std::to_string(i) + " has length " + std::to_string(lengths[i]) +
                                        "; every sample needs at least one position");
        if (lengths[i] > lengths_buckets.largest())
            throw bucket_overflow("P7",
                                  "capscope plan rule P7: sample " + std::to_string(i) + " has length " + std::to_string(lengths[i]) +
                                      ", more than the largest length bucket, " + std::to_string(lengths_buckets.largest()) +
                                      " (length buckets " + detail::bucket_text(lengths_buckets) +
                                      ") -- fix: add a length bucket of at least " + std::to_string(lengths[i]) +
                                      " (length_buckets<...> or max_seq_length<N>), or split the sample",
                                  lengths[i], lengths_buckets.largest());
        if (lengths[i] > longest) longest = lengths[i];
    }
    return {choose_bucket(lengths_buckets, longest), int(lengths.size())};
}

} // namespace capscope
