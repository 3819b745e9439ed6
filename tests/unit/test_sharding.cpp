// Sharded data parallelism, host side (parallel/sharding.hpp): every rank's shard of every
// parameter, equal sizes for NCCL's all-gather and reduce-scatter, every element owned by exactly
// one rank, and a rank's memory falling as ranks are added.
#include <capscope/parallel/sharding.hpp>

#include <doctest/doctest.h>

#include <numeric>
#include <vector>

using namespace capscope;

TEST_CASE("shards: equal and aligned per rank, every element owned once, padding below one aligned row per rank") {
    const std::vector<std::size_t> counts = {1, 63, 64, 65, 1000, 4096, 12345, 3 * 1024 * 1024 + 7};
    const std::size_t total = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
    std::size_t previous = 0;
    for (int ranks : {1, 2, 3, 4, 8}) {
        const shard_layout l = make_shard_layout(counts, ranks, 64);
        CHECK(l.full_elements == l.shard_elements * std::size_t(ranks));
        CHECK(l.full_elements >= total);
        std::size_t shard_offset = 0, full_offset = 0;
        for (std::size_t i = 0; i < counts.size(); ++i) {
            const sharded_parameter& p = l.parameters[i];
            CHECK(p.shard % 64 == 0);
            CHECK(p.padded == p.shard * std::size_t(ranks));
            CHECK(p.padded >= p.count);
            CHECK(p.padded - p.count < std::size_t(ranks) * 64); // less than one aligned row per rank
            CHECK(p.offset_in_shard == shard_offset);
            CHECK(p.offset_in_full == full_offset);
            shard_offset += p.shard;
            full_offset += p.padded;
            // The ranks' owned ranges tile [0, count) in rank order, without gaps or overlaps.
            std::size_t covered = 0;
            for (int r = 0; r < ranks; ++r) {
                const auto [first, n] = l.owned(i, r);
                CHECK(first == std::min(covered, p.count));
                covered += n;
            }
            CHECK(covered == p.count);
        }
        if (ranks > 1) CHECK(l.shard_elements < previous); // memory per rank falls as ranks grow
        previous = l.shard_elements;
        MESSAGE(ranks, " rank(s): ", l.shard_elements, " elements per rank for ", total, " parameters");
    }
}

TEST_CASE("a shard layout refuses no ranks and a zero alignment") {
    CHECK_THROWS_AS(make_shard_layout({10}, 0), std::invalid_argument);
    CHECK_THROWS_AS(make_shard_layout({10}, 2, 0), std::invalid_argument);
    CHECK(make_shard_layout({}, 4).shard_elements == 0);
}
