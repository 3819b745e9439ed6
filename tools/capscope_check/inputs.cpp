#include "inputs.hpp"

#include "from_yaml.hpp"

#include <capscope/flags/argument_file.hpp>

#include <fmt/format.h>

#include <glob.h>

#include <algorithm>
#include <filesystem>

namespace capscope::check {

namespace fs = std::filesystem;

namespace {
bool is_pattern(const std::string& s) { return s.find_first_of("*?[") != std::string::npos; }

std::vector<std::string> glob_files(const std::string& pattern) {
    glob_t g{};
    std::vector<std::string> out;
    if (::glob(pattern.c_str(), 0, nullptr, &g) == 0)
        for (std::size_t i = 0; i < g.gl_pathc; ++i)
            if (fs::is_regular_file(g.gl_pathv[i])) out.emplace_back(g.gl_pathv[i]);
    ::globfree(&g);
    std::sort(out.begin(), out.end());
    return out;
}

//! "--cuda-graph-impl" -> "cuda_graph_impl", as Megatron's argparse names the value ("" for "--").
std::string dest_of(const std::string& flag) {
    const std::size_t first = flag.find_first_not_of('-');
    if (first == std::string::npos) return "";
    std::string d = flag.substr(first);
    std::replace(d.begin(), d.end(), '-', '_');
    return d;
}

//! Whether `word` stands in `text` as a whole word: cuda_graph_impl, not the cuda_graph of
//! cuda_graph_impl. (A plain search: a key such as "--a[" is no regular expression.)
bool has_word(const std::string& text, const std::string& word) {
    const auto inner = [](char c) { return (c >= 'a' && c <= 'z') || c == '_'; };
    if (word.empty()) return false;
    for (std::size_t at = text.find(word); at != std::string::npos; at = text.find(word, at + 1)) {
        const std::size_t end = at + word.size();
        if ((at == 0 || !inner(text[at - 1])) && (end == text.size() || !inner(text[end]))) return true;
    }
    return false;
}

//! Every model_config.yaml below `root`, and an input with an error for each directory that
//! cannot be read, each entry that cannot be looked at, and each model_config.yaml that is no
//! readable file (a link to nothing, say): a tree is never checked in part without saying so.
//! Links to directories are not followed, as find(1) does not: a link can lead out of the tree
//! (a data mount) or back into it.
void walk_tree(const fs::path& root, std::vector<std::string>& found, std::vector<input>& problems) {
    std::vector<fs::path> todo{root};
    while (!todo.empty()) {
        const fs::path dir = todo.back();
        todo.pop_back();
        std::error_code ec;
        fs::directory_iterator it(dir, ec);
        for (; !ec && it != fs::directory_iterator(); it.increment(ec)) {
            const fs::path& p = it->path();
            std::error_code sec;
            const bool link = it->is_symlink(sec);
            if (!sec && p.filename() == "model_config.yaml") {
                const fs::file_status st = fs::status(p, sec); // through a link
                if (fs::is_regular_file(st)) found.push_back(p.string());
                else problems.push_back({input::kind::yaml, p.string(),
                                         "cannot read " + p.string() + (sec ? ": " + sec.message() : ": it is not a file")});
                continue;
            }
            const bool directory = !sec && !link && it->is_directory(sec);
            if (sec)
                problems.push_back({input::kind::yaml, p.string(), "cannot look at " + p.string() + ": " + sec.message() +
                                                                       " (any configs below it are not checked)"});
            else if (directory)
                todo.push_back(p);
        }
        if (ec)
            problems.push_back({input::kind::yaml, dir.string(),
                                "cannot read the directory " + dir.string() + ": " + ec.message() + " (the configs below it are not checked)"});
    }
}

//! "a.yaml:12: ..." -> 12 (0 when the message names no line).
int line_in(const std::string& message, const std::string& path) {
    const std::string prefix = path + ":";
    if (message.rfind(prefix, 0) != 0) return 0;
    return std::atoi(message.c_str() + prefix.size());
}

//! The line of the YAML key a usage error is about ("argument --num-experts: invalid int value:
//! 'abc'" -> the --num-experts key's line), 0 when it names none.
//! Not when the command line gives the flag too: its value, which wins, may be the bad one.
int key_line_of(const std::string& message, const std::vector<std::pair<std::string, int>>& key_lines, const std::vector<std::string>& extra) {
    const std::string prefix = "argument ";
    const std::size_t colon = message.find(':');
    if (message.rfind(prefix, 0) != 0 || colon == std::string::npos) return 0;
    const std::string flag = message.substr(prefix.size(), colon - prefix.size());
    for (const std::string& a : extra)
        if (a == flag || a.rfind(flag + "=", 0) == 0) return 0;
    for (const auto& [key, line] : key_lines)
        if (key == flag) return line;
    return 0;
}

//! GitHub's annotation syntax: %, CR and LF in the message, and , : in properties, are escaped.
std::string escaped(const std::string& s, bool property) {
    std::string out;
    for (char c : s) {
        if (c == '%') out += "%25";
        else if (c == '\r') out += "%0D";
        else if (c == '\n') out += "%0A";
        else if (property && c == ':') out += "%3A";
        else if (property && c == ',') out += "%2C";
        else out += c;
    }
    return out;
}
} // namespace

std::vector<input> expand_yaml_inputs(const std::vector<std::string>& values) {
    std::vector<input> out;
    for (const std::string& v : values) {
        std::error_code ec;
        if (fs::is_directory(v, ec)) {
            std::vector<std::string> found;
            std::vector<input> problems;
            walk_tree(v, found, problems);
            std::sort(found.begin(), found.end());
            std::sort(problems.begin(), problems.end(), [](const input& a, const input& b) { return a.path < b.path; });
            if (found.empty() && problems.empty()) out.push_back({input::kind::yaml, v, "no model_config.yaml under the directory " + v});
            for (auto& f : found) out.push_back({input::kind::yaml, std::move(f), ""});
            for (auto& p : problems) out.push_back(std::move(p));
        } else if (is_pattern(v) && !fs::exists(v, ec)) {
            const auto found = glob_files(v);
            if (found.empty()) out.push_back({input::kind::yaml, v, "no file matches the pattern " + v});
            for (const auto& f : found) out.push_back({input::kind::yaml, f, ""});
        } else {
            out.push_back({input::kind::yaml, v, ""}); // a file, or one that cannot be read (said when read)
        }
    }
    return out;
}

input_result check_input(const input& in, const std::vector<std::string>& extra, const flags::parse_options& options) {
    input_result r;
    r.path = in.path;
    if (!in.error.empty()) {
        r.status = 2;
        r.error = in.error;
        return r;
    }
    try {
        std::vector<std::string> args;
        if (in.source == input::kind::yaml) {
            yaml_model_args y = read_model_args(in.path);
            args = std::move(y.args);
            r.key_lines = std::move(y.key_lines);
            r.model_args_line = y.model_args_line;
        } else {
            args = flags::expand_argument_files({"@" + in.path});
        }
        for (const auto& a : flags::expand_argument_files(extra)) args.push_back(a);
        r.line = flags::from_megatron_flags(args, options);
    } catch (const flags::flag_error& e) {
        r.status = 2;
        r.error = e.what();
        r.error_line = line_in(r.error, in.path);
        if (r.error_line == 0) r.error_line = key_line_of(r.error, r.key_lines, extra);
        return r;
    } catch (const std::exception& e) {
        // Anything else (yaml-cpp's, a bad_alloc) ends this input, never the run: the other
        // inputs of a tree are still checked, and this one counts as a usage error.
        r.status = 2;
        r.error = "cannot check " + in.path + ": " + e.what();
        return r;
    }
    r.report = validate(r.line.config);
    r.status = r.report.valid() && r.line.refused_inputs.empty() ? 0 : 1;
    return r;
}

int offending_line(const input_result& r, const finding& f) {
    const std::string about = std::string(f.rule->statement) + " " + std::string(f.rule->message);
    for (const auto& [flag, line] : r.key_lines) {
        if (has_word(about, dest_of(flag))) return line;
    }
    return r.model_args_line;
}

std::string verdict_line(const input_result& r) {
    if (r.status == 2) return r.path + ": USAGE ERROR: " + r.error;
    if (r.status == 0) return r.path + ": VALID";
    const std::size_t problems = r.line.refused_inputs.size() + r.report.violations.size();
    if (!r.line.refused_inputs.empty()) {
        const auto& first = r.line.refused_inputs.front();
        std::string s = fmt::format("{}: INVALID: [Megatron {}] {} -- fix: {}", r.path, first.where, first.message, first.fix);
        if (problems > 1) s += fmt::format(" (+{} more)", problems - 1);
        return s;
    }
    const finding& first = r.report.violations.front();
    std::string s = fmt::format("{}: INVALID: [{}] {} -- fix: {}", r.path, first.rule->id, first.text(), first.rule->fix);
    if (r.report.violations.size() > 1) s += fmt::format(" (+{} more)", r.report.violations.size() - 1);
    return s;
}

std::string github_annotation(const input_result& r) {
    if (r.status == 0) return "";
    if (r.status == 2)
        return fmt::format("::error file={},line={},title={}::{}", escaped(r.path, true), std::max(r.error_line, 1),
                           escaped("capscope-check: usage error", true), escaped(r.error, false));
    std::string out;
    for (const auto& refused : r.line.refused_inputs) {
        int line = r.model_args_line; // the first key the message names
        for (const auto& [flag, at] : r.key_lines)
            if (refused.message.find(flag) != std::string::npos) {
                line = at;
                break;
            }
        out += fmt::format("::error file={},line={},title={}::{}\n", escaped(r.path, true), line,
                           escaped("Megatron " + refused.where, true), escaped(refused.message + " -- fix: " + refused.fix, false));
    }
    for (const finding& v : r.report.violations)
        out += fmt::format("::error file={},line={},title={}::{}\n", escaped(r.path, true), offending_line(r, v),
                           escaped("capscope rule " + std::string(v.rule->id), true),
                           escaped(v.text() + " -- fix: " + std::string(v.rule->fix), false));
    out.pop_back();
    return out;
}

std::string summary_line(const std::vector<input_result>& results) {
    int counts[3] = {0, 0, 0};
    for (const auto& r : results) ++counts[r.status];
    return fmt::format("capscope-check: {} input{}: {} valid, {} invalid, {} usage error{}", results.size(), results.size() == 1 ? "" : "s",
                       counts[0], counts[1], counts[2], counts[2] == 1 ? "" : "s");
}

} // namespace capscope::check
