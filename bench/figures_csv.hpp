#pragma once
// The benchmarks' figures in one long CSV form (section, case, variant, metric, value), which
// bench/report.py merges from every bench of a bench/run_all.sh run into one table and plot.

#include <fstream>
#include <stdexcept>
#include <string>

namespace bench {

class figures_csv {
public:
    //! Writes nothing when `path` is empty.
    explicit figures_csv(const std::string& path) : path_(path) {
        if (path.empty()) return;
        out_.open(path);
        out_ << "section,case,variant,metric,value\n";
        if (!out_) throw std::runtime_error("could not write '" + path + "'");
    }
    void row(const std::string& section, const std::string& what, const std::string& variant, const std::string& metric, double value) {
        if (path_.empty()) return;
        out_ << field(section) << ',' << field(what) << ',' << field(variant) << ',' << field(metric) << ',' << value << '\n';
        if (!out_) throw std::runtime_error("could not write '" + path_ + "'");
    }

private:
    //! RFC 4180: quoted when it holds a comma or a quote, quotes doubled.
    static std::string field(const std::string& s) {
        if (s.find_first_of(",\"\n") == std::string::npos) return s;
        std::string q = "\"";
        for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
        return q + '"';
    }
    std::string path_;
    std::ofstream out_;
};

} // namespace bench
