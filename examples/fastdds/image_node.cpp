// A Fast DDS publisher or subscriber of rt/camera/image, for otelbpf's tests
// and golden captures (tests/test_ebpf_fastdds.py, scripts/record_dds_pcaps.sh).
//
//   image_node publisher  --frames N --rate HZ --size BYTES [--readers N] [--linger S] [--transport udp|shm] [--domain D]
//   image_node subscriber --seconds S [--transport udp|shm] [--domain D]
//
// The type is the one examples/dds_pipeline.py (Cyclone DDS) publishes,
// sensor_msgs::msg::dds_::Image_ {int64 frame; int64 stamp_ns; sequence<uint8> data},
// serialized by hand (ImageType below), so no IDL code generator is needed and
// the two vendors interoperate.
//
// --transport udp (the default) is what tracing needs (docs/ros2-dds.md):
// the builtin transports (shared memory + UDP) are off and one UDPv4 transport
// on 127.0.0.1 is used, with unicast discovery to 127.0.0.1 (initial peers),
// as the Cyclone examples do. --transport shm keeps Fast DDS's default
// (shared memory between processes of one host): only discovery crosses UDP.
//
// Prints "ready" once matched (publisher) or created (subscriber), one line
// per sample ("sent N" / "received N"), and "taken N" when a subscriber ends.

#include <fastdds/dds/domain/DomainParticipant.hpp>
#include <fastdds/dds/domain/DomainParticipantFactory.hpp>
#include <fastdds/dds/publisher/DataWriter.hpp>
#include <fastdds/dds/publisher/Publisher.hpp>
#include <fastdds/dds/subscriber/DataReader.hpp>
#include <fastdds/dds/subscriber/DataReaderListener.hpp>
#include <fastdds/dds/subscriber/SampleInfo.hpp>
#include <fastdds/dds/subscriber/Subscriber.hpp>
#include <fastdds/dds/topic/TopicDataType.hpp>
#include <fastdds/dds/topic/TypeSupport.hpp>
#include <fastdds/rtps/transport/UDPv4TransportDescriptor.h>
#include <fastrtps/utils/IPLocator.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

using namespace eprosima::fastdds::dds;
using eprosima::fastrtps::rtps::InstanceHandle_t;
using eprosima::fastrtps::rtps::IPLocator;
using eprosima::fastrtps::rtps::Locator_t;
using eprosima::fastrtps::rtps::SerializedPayload_t;

namespace {

struct Image {
    int64_t frame = 0;
    int64_t stamp_ns = 0;
    std::vector<uint8_t> data;
};

constexpr uint32_t kHeader = 4;           // encapsulation: scheme (2 bytes) + options
constexpr uint32_t kFixed = 8 + 8 + 4;    // frame, stamp_ns, sequence length
constexpr uint32_t kMaxData = 1 << 20;    // largest image this type accepts

// CDR (XCDR1, little endian) by hand. Every member is naturally aligned at
// these offsets, so XCDR2 (Cyclone may send it) reads the same way.
class ImageType : public TopicDataType {
public:
    ImageType() {
        setName("sensor_msgs::msg::dds_::Image_");
        m_typeSize = kHeader + kFixed + kMaxData;
        m_isGetKeyDefined = false;
        auto_fill_type_object(false);
        auto_fill_type_information(false);
    }

    bool serialize(void* data, SerializedPayload_t* payload) override {
        const Image& image = *static_cast<Image*>(data);
        uint32_t size = kHeader + kFixed + static_cast<uint32_t>(image.data.size());
        if (image.data.size() > kMaxData || payload->max_size < size) return false;
        uint8_t* out = payload->data;
        const uint8_t header[kHeader] = {0x00, 0x01, 0x00, 0x00};  // CDR_LE
        std::memcpy(out, header, kHeader);
        uint32_t count = static_cast<uint32_t>(image.data.size());
        std::memcpy(out + 4, &image.frame, 8);
        std::memcpy(out + 12, &image.stamp_ns, 8);
        std::memcpy(out + 20, &count, 4);
        if (count) std::memcpy(out + 24, image.data.data(), count);
        payload->length = size;
        payload->encapsulation = CDR_LE;
        return true;
    }

    bool deserialize(SerializedPayload_t* payload, void* data) override {
        Image& image = *static_cast<Image*>(data);
        if (payload->length < kHeader + kFixed) return false;
        const uint8_t* in = payload->data;
        bool little = in[1] & 1;  // CDR_LE / PL_CDR_LE / D_CDR2_LE ... all have bit 0 set
        if (!little) return false;  // this host and every test writer are little endian
        uint32_t count;
        std::memcpy(&image.frame, in + 4, 8);
        std::memcpy(&image.stamp_ns, in + 12, 8);
        std::memcpy(&count, in + 20, 4);
        if (count > payload->length - kHeader - kFixed) return false;
        image.data.assign(in + 24, in + 24 + count);
        return true;
    }

    std::function<uint32_t()> getSerializedSizeProvider(void* data) override {
        return [data]() { return kHeader + kFixed + static_cast<uint32_t>(static_cast<Image*>(data)->data.size()); };
    }

    void* createData() override { return new Image(); }
    void deleteData(void* data) override { delete static_cast<Image*>(data); }
    bool getKey(void*, InstanceHandle_t*, bool) override { return false; }
};

struct Options {
    std::string role;
    int frames = 5;
    double rate = 5.0;
    size_t size = 64;
    double seconds = 10.0;
    double linger = 1.0;
    int readers = 1;  // publisher: wait for this many matched readers
    int domain = 0;   // tests pick their own, so concurrent runs do not talk to each other
    std::string transport = "udp";
};

void say(const std::string& line) {
    std::string text = line + "\n";  // one write: several roles may share a pipe
    fwrite(text.data(), 1, text.size(), stdout);
    fflush(stdout);
}

[[noreturn]] void usage(const char* why) {
    fprintf(stderr, "image_node: %s\nusage: image_node publisher|subscriber [--frames N] [--rate HZ] "
                    "[--size BYTES] [--readers N] [--seconds S] [--linger S] [--transport udp|shm] [--domain D]\n", why);
    exit(2);
}

Options parse(int argc, char** argv) {
    Options options;
    if (argc < 2) usage("no role");
    options.role = argv[1];
    if (options.role != "publisher" && options.role != "subscriber") usage("unknown role");
    for (int i = 2; i < argc; i += 2) {
        if (i + 1 >= argc) usage("an option lacks its value");
        std::string name = argv[i], value = argv[i + 1];
        if (name == "--frames") options.frames = std::stoi(value);
        else if (name == "--rate") options.rate = std::stod(value);
        else if (name == "--size") options.size = std::stoul(value);
        else if (name == "--seconds") options.seconds = std::stod(value);
        else if (name == "--linger") options.linger = std::stod(value);
        else if (name == "--readers") options.readers = std::stoi(value);
        else if (name == "--domain") options.domain = std::stoi(value);
        else if (name == "--transport") options.transport = value;
        else usage("unknown option");
    }
    if (options.transport != "udp" && options.transport != "shm") usage("--transport is udp or shm");
    if (options.size > kMaxData) usage("--size is at most 1048576");
    if (options.domain < 0 || options.domain > 232) usage("--domain is 0 to 232");
    return options;
}

DomainParticipantQos participant_qos(const std::string& transport) {
    DomainParticipantQos qos = PARTICIPANT_QOS_DEFAULT;
    qos.name("otelbpf_image_node");
    if (transport == "udp") {
        // UDP only, on loopback: what the agent can see.
        auto udp = std::make_shared<eprosima::fastdds::rtps::UDPv4TransportDescriptor>();
        udp->interfaceWhiteList.emplace_back("127.0.0.1");
        qos.transport().user_transports.push_back(udp);
        qos.transport().use_builtin_transports = false;
        Locator_t peer;
        IPLocator::setIPv4(peer, 127, 0, 0, 1);
        qos.wire_protocol().builtin.initialPeersList.push_back(peer);
    }
    return qos;
}

void sleep_s(double seconds) {
    std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
}

class Counter : public DataReaderListener {
public:
    std::atomic<int> taken{0};

    void on_data_available(DataReader* reader) override {
        Image image;
        SampleInfo info;
        while (reader->take_next_sample(&image, &info) == ReturnCode_t::RETCODE_OK) {
            if (!info.valid_data) continue;
            taken++;
            say("received " + std::to_string(image.frame));
        }
    }
};

int run(const Options& options) {
    auto factory = DomainParticipantFactory::get_instance();
    DomainParticipant* participant = factory->create_participant(options.domain, participant_qos(options.transport));
    if (!participant) usage("could not create the participant");
    TypeSupport type(new ImageType());
    type.register_type(participant);
    Topic* topic = participant->create_topic("rt/camera/image", type.get_type_name(), TOPIC_QOS_DEFAULT);
    int status = 0;
    if (options.role == "publisher") {
        Publisher* publisher = participant->create_publisher(PUBLISHER_QOS_DEFAULT);
        DataWriterQos qos = DATAWRITER_QOS_DEFAULT;
        qos.reliability().kind = RELIABLE_RELIABILITY_QOS;
        qos.history().kind = KEEP_LAST_HISTORY_QOS;
        qos.history().depth = 64;
        DataWriter* writer = publisher->create_datawriter(topic, qos);
        PublicationMatchedStatus matched;
        for (int i = 0; i < 400; i++) {  // 20 s for the readers to match
            writer->get_publication_matched_status(matched);
            if (matched.current_count >= options.readers) break;
            sleep_s(0.05);
        }
        say("ready");
        Image image;
        image.data.assign(options.size, 7);
        auto started = std::chrono::steady_clock::now();
        for (int frame = 0; frame < options.frames; frame++) {
            image.frame = frame;
            image.stamp_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                                 std::chrono::system_clock::now().time_since_epoch()).count();
            if (!writer->write(&image)) status = 1;
            say("sent " + std::to_string(frame));
            if (options.rate > 0)  // paced on a schedule, so a slow write does not lower the rate
                std::this_thread::sleep_until(started + std::chrono::duration<double>((frame + 1) / options.rate));
        }
        sleep_s(options.linger);
        publisher->delete_datawriter(writer);
        participant->delete_publisher(publisher);
    } else {
        Subscriber* subscriber = participant->create_subscriber(SUBSCRIBER_QOS_DEFAULT);
        DataReaderQos qos = DATAREADER_QOS_DEFAULT;
        qos.reliability().kind = RELIABLE_RELIABILITY_QOS;
        qos.history().kind = KEEP_LAST_HISTORY_QOS;
        qos.history().depth = 64;
        Counter counter;
        DataReader* reader = subscriber->create_datareader(topic, qos, &counter);
        say("ready");
        sleep_s(options.seconds);
        subscriber->delete_datareader(reader);
        participant->delete_subscriber(subscriber);
        say("taken " + std::to_string(counter.taken.load()));
    }
    participant->delete_topic(topic);
    factory->delete_participant(participant);
    return status;
}

}  // namespace

int main(int argc, char** argv) {
    try {
        return run(parse(argc, argv));
    } catch (const std::exception& error) {
        usage(error.what());
    }
}
