package platformcall

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// The baselines' mapping: the field rules of mappings/README.md written by hand in Go, the way a
// textbook forwarder would, with encoding/json. It is not the product's
// mapping (mappings/*.blobl); it exists so that the baselines send the same
// requests as the forwarder, and it is cheaper than Bloblang, which favours
// the baselines.

// Mapped is one Kafka message made ready for the outbox and the platform.
type Mapped struct {
	Key, APIType, Topic string
	Partition           int32
	Offset              int64
	KafkaKey, Payload   []byte
	// Plate, Park, Berth and Device are the lookup columns `outbox find`
	// searches, stored as the forwarder stores them ("" for NULL).
	Plate, Park, Berth, Device string
	// Path and Body are the platform request; Err a mapping error (the row
	// is then stored FAILED and never sent).
	Path string
	Body []byte
	Err  error
}

type pictureIn struct {
	PicType json.Number `json:"picType"`
	PicURL  string      `json:"picUrl"`
}

type vehicleIn struct {
	MessageID     string       `json:"messageId"`
	DeviceID      string       `json:"deviceId"`
	ParkCode      string       `json:"parkCode"`
	BerthCode     string       `json:"berthCode"`
	ItemID        json.Number  `json:"itemId"`
	PlateNo       string       `json:"plateNo"`
	PlateColor    json.Number  `json:"plateColor"`
	InoutType     *json.Number `json:"inoutType"`
	InoutTime     json.Number  `json:"inoutTime"`
	PlateCredible json.Number  `json:"plateCredible"`
	Pictures      []pictureIn  `json:"pictures"`
}

type heartbeatIn struct {
	MessageID   string      `json:"messageId"`
	DeviceID    string      `json:"deviceId"`
	ParkCode    string      `json:"parkCode"`
	BerthCode   string      `json:"berthCode"`
	CaptureTime json.Number `json:"captureTime"`
	PicType     json.Number `json:"picType"`
	PicURL      string      `json:"picUrl"`
}

type pictureOut struct {
	PicType string `json:"pic_type"`
	PicURL  string `json:"pic_url"`
}

// outHead is what every request starts with: the platform account and the
// message and device it is about.
type outHead struct {
	AccessName string `json:"access_name"`
	AccessPwd  string `json:"access_pwd"`
	MessageID  string `json:"message_id"`
	DeviceID   string `json:"device_id"`
	ParkCode   string `json:"park_code"`
	BerthCode  string `json:"berth_code"`
}

type vehicleOut struct {
	outHead
	ItemID      string       `json:"item_id,omitempty"`
	PlateNo     string       `json:"plate_no"`
	PlateColor  string       `json:"plate_color,omitempty"`
	EnterState  string       `json:"enter_state"`
	EventTime   string       `json:"event_time"`
	Credibility string       `json:"credibility"`
	Pictures    []pictureOut `json:"pictures"`
}

type heartbeatOut struct {
	outHead
	CaptureTime string `json:"capture_time"`
	PicType     string `json:"pic_type"`
	PicURL      string `json:"pic_url"`
}

// Mapper holds what every mapping needs.
type Mapper struct {
	vehicleTopic          string
	accessName, accessPwd string
	loc                   *time.Location
}

// NewMapper maps the messages of vehicleTopic as vehicle events and every
// other topic's as heartbeats, signing requests with the platform account
// and formatting times in loc (PLATFORM_TZ).
func NewMapper(vehicleTopic, accessName, accessPwd string, loc *time.Location) *Mapper {
	return &Mapper{vehicleTopic: vehicleTopic, accessName: accessName, accessPwd: accessPwd, loc: loc}
}

func (mp *Mapper) Map(topic string, partition int32, offset int64, key, value []byte) Mapped {
	m := Mapped{Topic: topic, Partition: partition, Offset: offset, KafkaKey: key, Payload: value, APIType: "HEARTBEAT"}
	if topic == mp.vehicleTopic {
		m.APIType = "VEHICLE_EVENT"
	}
	var id string
	if m.APIType == "VEHICLE_EVENT" {
		m.Path = "/mch/business"
		var in vehicleIn
		if m.Err = json.Unmarshal(value, &in); m.Err == nil {
			id = in.MessageID
			m.Plate, m.Park, m.Berth, m.Device = in.PlateNo, in.ParkCode, in.BerthCode, in.DeviceID
			m.Body, m.Err = mp.vehicle(&in, fallbackKey(id, topic, partition, offset))
		}
	} else {
		m.Path = "/mch/heartbeat"
		var in heartbeatIn
		if m.Err = json.Unmarshal(value, &in); m.Err == nil {
			id = in.MessageID
			m.Park, m.Berth, m.Device = in.ParkCode, in.BerthCode, in.DeviceID
			m.Body, m.Err = mp.heartbeat(&in, fallbackKey(id, topic, partition, offset))
		}
	}
	m.Key = fallbackKey(id, topic, partition, offset)
	return m
}

func fallbackKey(id, topic string, partition int32, offset int64) string {
	if id != "" {
		return id
	}
	return topic + "-" + strconv.Itoa(int(partition)) + "-" + strconv.FormatInt(offset, 10)
}

func (mp *Mapper) vehicle(in *vehicleIn, key string) ([]byte, error) {
	for name, v := range map[string]string{"deviceId": in.DeviceID, "parkCode": in.ParkCode, "berthCode": in.BerthCode, "plateNo": in.PlateNo} {
		if v == "" {
			return nil, fmt.Errorf("mapping: %s is missing", name)
		}
	}
	out := vehicleOut{
		outHead: mp.head(key, in.DeviceID, in.ParkCode, in.BerthCode), PlateNo: in.PlateNo,
		ItemID: in.ItemID.String(), PlateColor: in.PlateColor.String(), Pictures: []pictureOut{},
	}
	switch {
	case in.InoutType == nil:
		return nil, errors.New("mapping: inoutType is missing")
	case *in.InoutType == "0":
		out.EnterState = "2"
	case *in.InoutType == "1":
		out.EnterState = "1"
	default:
		return nil, fmt.Errorf("mapping: inoutType %s is not 0 or 1", *in.InoutType)
	}
	var err error
	if out.EventTime, err = mp.formatTime(in.InoutTime, "inoutTime"); err != nil {
		return nil, err
	}
	out.Credibility = "0"
	if in.PlateCredible != "" {
		f, err := in.PlateCredible.Float64()
		if err != nil {
			return nil, fmt.Errorf("mapping: plateCredible %q is not a number", in.PlateCredible)
		}
		out.Credibility = strconv.Itoa(int(math.Max(0, math.Min(100, math.Floor(f*100+0.5+1e-9)))))
	}
	for _, p := range in.Pictures {
		t, err := picType(p.PicType)
		if err != nil {
			return nil, err
		}
		u, err := picURL(p.PicURL)
		if err != nil {
			return nil, err
		}
		out.Pictures = append(out.Pictures, pictureOut{PicType: t, PicURL: u})
	}
	return json.Marshal(&out)
}

func (mp *Mapper) heartbeat(in *heartbeatIn, key string) ([]byte, error) {
	for name, v := range map[string]string{"deviceId": in.DeviceID, "parkCode": in.ParkCode, "berthCode": in.BerthCode} {
		if v == "" {
			return nil, fmt.Errorf("mapping: %s is missing", name)
		}
	}
	out := heartbeatOut{outHead: mp.head(key, in.DeviceID, in.ParkCode, in.BerthCode)}
	var err error
	if out.CaptureTime, err = mp.formatTime(in.CaptureTime, "captureTime"); err != nil {
		return nil, err
	}
	if out.PicType, err = picType(in.PicType); err != nil {
		return nil, err
	}
	if out.PicURL, err = picURL(in.PicURL); err != nil {
		return nil, err
	}
	return json.Marshal(&out)
}

func (mp *Mapper) head(key, device, park, berth string) outHead {
	return outHead{AccessName: mp.accessName, AccessPwd: mp.accessPwd, MessageID: key,
		DeviceID: device, ParkCode: park, BerthCode: berth}
}

func (mp *Mapper) formatTime(n json.Number, field string) (string, error) {
	ms, err := n.Int64()
	if err != nil {
		return "", fmt.Errorf("mapping: %s %q is not epoch milliseconds", field, n)
	}
	return time.UnixMilli(ms).In(mp.loc).Format(time.DateTime), nil
}

func picType(n json.Number) (string, error) {
	switch n {
	case "1":
		return "1", nil
	case "2", "4":
		return "2", nil
	case "3":
		return "0", nil
	}
	return "", fmt.Errorf("mapping: picType %q is not 1, 2, 3 or 4", n)
}

func picURL(u string) (string, error) {
	switch {
	case u == "":
		return "", errors.New("mapping: picUrl is empty")
	case strings.HasPrefix(u, "/"), strings.HasPrefix(u, "http://"), strings.HasPrefix(u, "https://"):
		return u, nil
	}
	return "/" + u, nil
}
