#pragma once
//! @file
//! Argument files: `capscope-check @train_args.txt`. Each `@FILE` argument is replaced by the
//! arguments in FILE, split as a POSIX shell splits words (any number per line; 'single' and
//! "double" quotes, backslash escapes, `#` comments), and files may name further `@FILE`s. A
//! relative path is relative to the working directory. Errors name the file and the line.

#include <capscope/flags/from_megatron_flags.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace capscope::flags {

namespace detail {

//! Splits `text` into words like `shlex.split(text, comments=True)`; `where(line)` names a line
//! in errors.
template <class Where>
std::vector<std::string> shell_words(const std::string& text, Where&& where) {
    std::vector<std::string> words;
    std::string word;
    bool in_word = false;
    int line = 1, quote_line = 0;
    std::size_t i = 0;
    auto finish = [&] {
        if (in_word) words.push_back(word);
        word.clear();
        in_word = false;
    };
    while (i < text.size()) {
        const char c = text[i];
        if (c == '\n') ++line;
        if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
            finish();
            ++i;
        } else if (c == '#' && !in_word) {
            while (i < text.size() && text[i] != '\n') ++i;
        } else if (c == '\\') {
            if (i + 1 < text.size() && text[i + 1] == '\n') { // a line continuation
                ++line;
                i += 2;
                continue;
            }
            if (i + 1 >= text.size()) throw flag_error(where(line) + ": a backslash ends the file");
            word += text[i + 1];
            in_word = true;
            i += 2;
        } else if (c == '\'') {
            quote_line = line;
            const std::size_t end = text.find('\'', i + 1);
            if (end == std::string::npos) throw flag_error(where(quote_line) + ": unterminated single quote");
            for (std::size_t k = i + 1; k < end; ++k) line += text[k] == '\n';
            word += text.substr(i + 1, end - i - 1);
            in_word = true;
            i = end + 1;
        } else if (c == '"') {
            quote_line = line;
            std::size_t k = i + 1;
            for (;; ++k) {
                if (k >= text.size()) throw flag_error(where(quote_line) + ": unterminated double quote");
                if (text[k] == '"') break;
                if (text[k] == '\n') ++line;
                if (text[k] == '\\' && k + 1 < text.size() &&
                    (text[k + 1] == '"' || text[k + 1] == '\\' || text[k + 1] == '$' || text[k + 1] == '`')) {
                    word += text[++k];
                    continue;
                }
                word += text[k];
            }
            in_word = true;
            i = k + 1;
        } else {
            word += c;
            in_word = true;
            ++i;
        }
    }
    finish();
    return words;
}

//! The most an input file may hold (a YAML file, or one argument file), the most argument files
//! one command line may read (counting a file each time it is named), and the most bytes they may
//! hold together: a config is kilobytes, and a file that names the next one three times, 15 deep,
//! would otherwise be read 3^15 times (or a 16 MiB file named 1000 times: 16 GB).
inline constexpr std::uintmax_t max_input_file_bytes = std::uintmax_t(16) << 20;
inline constexpr int max_argument_file_reads = 1000;
inline constexpr std::uintmax_t max_argument_file_bytes_in_all = std::uintmax_t(4) << 20;

//! What one command line's argument files have used of the limits above.
struct argument_file_budget {
    int reads = 0;
    std::uintmax_t bytes = 0;
};

//! Refuses, before reading it, a path that is no regular file (a directory, a FIFO that would
//! block forever, a device such as /dev/zero that never ends) or that is larger than any config.
//! `what` names it in the message ("argument file", "YAML file").
inline void require_regular_file(const std::string& path, const char* what) {
    std::error_code ec;
    const auto status = std::filesystem::status(path, ec);
    if (ec) return; // missing or unreachable: opening it says so, as for any file that cannot be read
    if (std::filesystem::is_directory(status)) // an ifstream opens one and reads nothing
        throw flag_error(path + " is a directory, not an " + what + " -- fix: name a file of arguments "
                         "(a tree of model_config.yaml files is --from-yaml DIR)");
    if (!std::filesystem::is_regular_file(status))
        throw flag_error(path + " is not a regular file (a FIFO, a socket or a device), so it is not read as an " + what +
                         " -- fix: name a file on disk");
    if (const std::uintmax_t bytes = std::filesystem::file_size(path, ec); !ec && bytes > max_input_file_bytes)
        throw flag_error(path + " is " + std::to_string(bytes) + " bytes, more than the " + std::to_string(max_input_file_bytes >> 20) +
                         " MiB an " + what + " may hold -- fix: name the config's own file");
}

inline void expand_into(const std::vector<std::string>& args, std::vector<std::string>& out, int depth, argument_file_budget& used) {
    for (const std::string& a : args) {
        if (a.size() < 2 || a[0] != '@') {
            out.push_back(a);
            continue;
        }
        const std::string path = a.substr(1);
        if (depth >= 16) throw flag_error(path + ": argument files nest more than 16 deep (does one name itself?)");
        if (++used.reads > max_argument_file_reads)
            throw flag_error(path + ": more than " + std::to_string(max_argument_file_reads) +
                             " argument files read for one command line (do files name others several times each?)");
        require_regular_file(path, "argument file");
        std::ifstream in(path, std::ios::binary);
        if (!in) throw flag_error("cannot read argument file " + path);
        std::ostringstream text;
        text << in.rdbuf();
        const std::string t = text.str();
        if ((used.bytes += t.size()) > max_argument_file_bytes_in_all)
            throw flag_error(path + ": the argument files of one command line hold more than " +
                             std::to_string(max_argument_file_bytes_in_all >> 20) + " MiB in all (a config is kilobytes: is a large file named many times?)");
        if (const std::size_t at = t.find('\0'); at != std::string::npos)
            throw flag_error(path + ":" + std::to_string(1 + std::count(t.begin(), t.begin() + std::ptrdiff_t(at), '\n')) +
                             ": a NUL byte: an argument file is text (was a binary file named?)");
        expand_into(shell_words(t, [&](int line) { return path + ":" + std::to_string(line); }), out, depth + 1, used);
    }
}

} // namespace detail

//! The arguments with every `@FILE` replaced by the arguments it holds (recursively).
inline std::vector<std::string> expand_argument_files(const std::vector<std::string>& args) {
    std::vector<std::string> out;
    detail::argument_file_budget used;
    detail::expand_into(args, out, 0, used);
    return out;
}

} // namespace capscope::flags
