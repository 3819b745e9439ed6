#include "from_yaml.hpp"

#include <capscope/flags/argument_file.hpp>
#include <capscope/flags/from_megatron_flags.hpp>

#include <yaml-cpp/depthguard.h>
#include <yaml-cpp/yaml.h>

namespace capscope::check {

namespace {
std::string where(const std::string& path, const YAML::Mark& mark) { return path + ":" + std::to_string(mark.line + 1); }

//! The booleans of YAML 1.1, as Python's yaml.safe_load reads them (Megatron's functional tests
//! load their model_config.yaml with it): TRUE and on are true there, not text.
bool is_yaml11_bool(const std::string& text, bool value) {
    static constexpr const char* truths[] = {"true", "True", "TRUE", "yes", "Yes", "YES", "on", "On", "ON"};
    static constexpr const char* falsehoods[] = {"false", "False", "FALSE", "no", "No", "NO", "off", "Off", "OFF"};
    for (const char* w : value ? truths : falsehoods)
        if (text == w) return true;
    return false;
}
} // namespace

yaml_model_args read_model_args(const std::string& path) {
    flags::detail::require_regular_file(path, "YAML file"); // a FIFO would block, /dev/zero never end
    std::vector<YAML::Node> documents;
    try {
        documents = YAML::LoadAllFromFile(path);
    } catch (const YAML::BadFile&) {
        throw flags::flag_error("cannot read " + path);
    } catch (const YAML::DeepRecursion& e) { // yaml-cpp's guard says "bad file" here
        throw flags::flag_error(where(path, e.mark) + ": YAML nested deeper than the reader takes (" + std::to_string(e.depth()) +
                                " levels) -- fix: a model_config.yaml maps flags to values, nested a level or two");
    } catch (const YAML::ParserException& e) {
        throw flags::flag_error(where(path, e.mark) + ": not YAML: " + e.msg);
    }
    // A second document would go unchecked: Megatron's functional tests read one. (An empty one,
    // as a trailing '---' makes, holds nothing to lose.)
    for (std::size_t d = 1; d < documents.size(); ++d)
        if (!documents[d].IsNull())
            throw flags::flag_error(where(path, documents[d].Mark()) + ": a second YAML document ('---'); a model_config.yaml holds one -- " +
                                    "fix: put each config in a file of its own");
    YAML::Node root = documents.empty() ? YAML::Node() : documents.front();
    if (!root.IsMap() || !root["MODEL_ARGS"]) throw flags::flag_error(path + ": no MODEL_ARGS mapping at the top level");
    const YAML::Node args = root["MODEL_ARGS"];
    if (!args.IsMap()) throw flags::flag_error(where(path, args.Mark()) + ": MODEL_ARGS is not a mapping of flags to values");
    yaml_model_args result;
    for (const auto& entry : root)
        if (entry.first.Scalar() == "MODEL_ARGS") result.model_args_line = entry.first.Mark().line + 1;
    std::vector<std::string>& out = result.args;
    for (const auto& entry : args) {
        if (!entry.first.IsScalar())
            throw flags::flag_error(where(path, entry.first.Mark()) + ": a MODEL_ARGS key is a " +
                                    (entry.first.IsSequence() ? "list" : entry.first.IsMap() ? "mapping" : "null") +
                                    ", not a --flag name");
        const std::string flag = entry.first.Scalar();
        result.key_lines.emplace_back(flag, entry.first.Mark().line + 1);
        const YAML::Node& value = entry.second;
        if (flag.rfind("--", 0) != 0)
            throw flags::flag_error(where(path, entry.first.Mark()) + ": MODEL_ARGS key '" + flag + "' is not a --flag");
        if (value.IsNull()) continue;
        if (value.IsSequence()) {
            out.push_back(flag);
            for (const auto& item : value) {
                if (!item.IsScalar()) throw flags::flag_error(where(path, item.Mark()) + ": " + flag + ": a list holds plain values only");
                out.push_back(item.Scalar());
            }
            continue;
        }
        if (!value.IsScalar()) throw flags::flag_error(where(path, value.Mark()) + ": " + flag + ": a value must be a scalar or a list");
        const std::string& text = value.Scalar();
        const bool plain = value.Tag() != "!"; // quoted scalars are strings, never booleans
        if (plain && is_yaml11_bool(text, true)) out.push_back(flag);
        else if (plain && is_yaml11_bool(text, false)) continue;
        else {
            out.push_back(flag);
            out.push_back(text);
        }
    }
    return result;
}

} // namespace capscope::check
